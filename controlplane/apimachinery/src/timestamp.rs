//! Timestamps as kube writes them (RFC 3339, seconds, UTC `Z`) and ages as kubectl prints them.

use std::time::{Duration, SystemTime};

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// `2026-11-24T07:53:36Z` (metav1.Time's JSON form: whole seconds, UTC).
pub fn format_rfc3339(at: SystemTime) -> String {
    let at = OffsetDateTime::from(at);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        at.year(),
        u8::from(at.month()),
        at.day(),
        at.hour(),
        at.minute(),
        at.second()
    )
}

/// Parses an RFC 3339 timestamp; `None` when it is not one.
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    OffsetDateTime::parse(text, &Rfc3339)
        .ok()
        .map(SystemTime::from)
}

/// The age of something created at `then`, seen at `now`, as `duration.HumanDuration` prints
/// it (`5m`, `3h12m`, `2d4h`, `<invalid>` when `then` is in the future by 2 s or more).
pub fn human_age(then: SystemTime, now: SystemTime) -> String {
    let seconds: i64 = match now.duration_since(then) {
        Ok(age) => i64::try_from(age.as_secs()).unwrap_or(i64::MAX),
        Err(ahead) => -i64::try_from(ahead.duration().as_secs()).unwrap_or(i64::MAX),
    };
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    human_duration(Duration::from_secs(seconds.unsigned_abs()))
}

fn with_remainder(value: u64, unit: &str, rest: u64, rest_unit: &str) -> String {
    if rest == 0 {
        format!("{value}{unit}")
    } else {
        format!("{value}{unit}{rest}{rest_unit}")
    }
}

fn human_duration(age: Duration) -> String {
    let seconds = age.as_secs();
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        return with_remainder(minutes, "m", seconds % 60, "s");
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        return with_remainder(hours, "h", minutes % 60, "m");
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        return with_remainder(hours / 24, "d", hours % 24, "h");
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        return with_remainder(hours / 24 / 365, "y", (hours / 24) % 365, "d");
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_and_parses() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_795_000_000_500);
        let text = format_rfc3339(at);
        assert_eq!(text, "2026-11-18T11:06:40Z");
        let back = parse_rfc3339(&text).expect("parses");
        assert_eq!(format_rfc3339(back), text);
        assert!(parse_rfc3339("yesterday").is_none());
    }

    #[test]
    fn ages_like_kubectl() {
        let then = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let age = |s: u64| human_age(then, then + Duration::from_secs(s));
        assert_eq!(age(5), "5s");
        assert_eq!(age(119), "119s");
        assert_eq!(age(150), "2m30s");
        assert_eq!(age(600), "10m");
        assert_eq!(age(3 * 3600 + 60), "3h1m");
        assert_eq!(age(30 * 3600), "30h");
        assert_eq!(age(50 * 3600), "2d2h");
        assert_eq!(age(100 * 86400), "100d");
        assert_eq!(age(3 * 365 * 86400), "3y");
        assert_eq!(human_age(then, then - Duration::from_secs(1)), "0s");
        assert_eq!(human_age(then, then - Duration::from_secs(5)), "<invalid>");
    }
}
