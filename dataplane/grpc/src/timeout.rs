//! The `grpc-timeout` header: up to 8 ASCII digits and a unit (H, M, S, m, u, n).

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeoutError {
    #[error("grpc-timeout {0:?} is not 1-8 digits followed by H, M, S, m, u or n")]
    Malformed(String),
}

/// Parses a `grpc-timeout` value.
pub fn parse_timeout(value: &[u8]) -> Result<Duration, TimeoutError> {
    let malformed = || TimeoutError::Malformed(String::from_utf8_lossy(value).into_owned());
    let (unit, digits) = value.split_last().ok_or_else(malformed)?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(malformed());
    }
    let amount: u64 = digits
        .iter()
        .fold(0, |total, digit| total * 10 + u64::from(digit - b'0'));
    Ok(match unit {
        b'H' => Duration::from_secs(amount * 3600),
        b'M' => Duration::from_secs(amount * 60),
        b'S' => Duration::from_secs(amount),
        b'm' => Duration::from_millis(amount),
        b'u' => Duration::from_micros(amount),
        b'n' => Duration::from_nanos(amount),
        _ => return Err(malformed()),
    })
}

/// Encodes a duration as a `grpc-timeout` value in the finest unit that fits 8 digits, rounding
/// up so a forwarded deadline is never shorter than the time that remains.
pub fn encode_timeout(duration: Duration) -> String {
    const MAX: u128 = 99_999_999;
    let nanos = duration.as_nanos();
    for (unit, size) in [
        ('n', 1u128),
        ('u', 1_000),
        ('m', 1_000_000),
        ('S', 1_000_000_000),
        ('M', 60_000_000_000),
        ('H', 3_600_000_000_000),
    ] {
        let amount = nanos.div_ceil(size);
        if amount <= MAX {
            return format!("{amount}{unit}");
        }
    }
    format!("{MAX}H")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_every_unit() {
        assert_eq!(parse_timeout(b"2H"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_timeout(b"3M"), Ok(Duration::from_secs(180)));
        assert_eq!(parse_timeout(b"1S"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_timeout(b"250m"), Ok(Duration::from_millis(250)));
        assert_eq!(
            parse_timeout(b"99999999u"),
            Ok(Duration::from_micros(99_999_999))
        );
        assert_eq!(parse_timeout(b"5n"), Ok(Duration::from_nanos(5)));
    }

    #[test]
    fn refuses_malformed_values() {
        for bad in [
            &b""[..],
            b"S",
            b"10",
            b"123456789S",
            b"1x",
            b"-1S",
            b"1.5S",
            b" 1S",
        ] {
            assert!(
                parse_timeout(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn encodes_in_the_finest_unit_that_fits() {
        assert_eq!(encode_timeout(Duration::from_nanos(5)), "5n");
        assert_eq!(encode_timeout(Duration::from_millis(1500)), "1500000u");
        assert_eq!(encode_timeout(Duration::from_secs(120)), "120000m");
        assert_eq!(
            encode_timeout(Duration::from_secs(86_400 * 365)),
            "31536000S"
        );
        assert_eq!(
            encode_timeout(Duration::from_secs(86_400 * 365 * 4)),
            "2102400M"
        );
    }

    proptest! {
        #[test]
        fn parse_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..16)) {
            let _ = parse_timeout(&bytes);
        }

        #[test]
        fn encode_parse_round_trip_never_shortens(nanos in 0u64..(u64::MAX / 4)) {
            let duration = Duration::from_nanos(nanos);
            let parsed = parse_timeout(encode_timeout(duration).as_bytes()).unwrap();
            prop_assert!(parsed >= duration);
        }
    }
}
