//! Helpers shared by the integration tests.
#![allow(clippy::unwrap_used, dead_code)]

pub mod switch;

/// `ovs-ofctl parse-flow` turns a masked `set_field` with a contiguous mask into the equivalent
/// `load:V->FIELD[lo..hi]`; rewrite that back so both texts can be compared.
pub fn loads_as_set_fields(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("load:") {
        out.push_str(&rest[..at]);
        let load = &rest[at + 5..];
        let (value, after) = load.split_once("->").unwrap();
        let (field, after) = after.split_once('[').unwrap();
        let (range, after) = after.split_once(']').unwrap();
        let value = u128::from_str_radix(value.trim_start_matches("0x"), 16).unwrap();
        let (lo, hi) = range.split_once("..").unwrap();
        let (lo, hi): (u32, u32) = (lo.parse().unwrap(), hi.parse().unwrap());
        let bits = hi - lo + 1;
        let mask = if bits == 128 {
            u128::MAX
        } else {
            ((1u128 << bits) - 1) << lo
        };
        let name = match field {
            "NXM_NX_CT_LABEL" => "ct_label".to_string(),
            "NXM_NX_CT_MARK" => "ct_mark".to_string(),
            reg => reg
                .strip_prefix("NXM_NX_REG")
                .map(|n| format!("reg{n}"))
                .unwrap(),
        };
        out.push_str(&format!("set_field:{:#x}/{mask:#x}->{name}", value << lo));
        rest = after;
    }
    out.push_str(rest);
    out
}
