//! Instructions (meter, apply-actions, goto-table) and actions, including the Nicira extensions the
//! policy flows need: conjunction, ct, controller2, resubmit and reg_load2.

use super::oxm::{self, Tlv, NX_CT_LABEL, NX_CT_MARK};
use super::wire::{Put, Reader};
use super::{DecodeError, EncodeError};
use crate::flow::{port, Action, Masked};

const OFPIT_GOTO_TABLE: u16 = 1;
const OFPIT_APPLY_ACTIONS: u16 = 4;
const OFPIT_METER: u16 = 6;
const OFPAT_OUTPUT: u16 = 0;
const OFPAT_SET_FIELD: u16 = 25;
const OFPAT_EXPERIMENTER: u16 = 0xffff;
pub(crate) const NX_VENDOR_ID: u32 = 0x0000_2320;
const NXAST_REG_LOAD: u16 = 7;
const NXAST_RESUBMIT_TABLE: u16 = 14;
const NXAST_REG_LOAD2: u16 = 33;
const NXAST_CONJUNCTION: u16 = 34;
const NXAST_CT: u16 = 35;
const NXAST_CONTROLLER2: u16 = 37;
const NXAC2PT_MAX_LEN: u16 = 0;
const NXAC2PT_USERDATA: u16 = 3;
const NX_CT_F_COMMIT: u16 = 1;
const NX_CT_RECIRC_NONE: u8 = 0xff;
/// `OFPP_IN_PORT` in the 16-bit port space of Nicira actions: "the packet's own in_port".
const NX_OFPP_IN_PORT: u16 = 0xfff8;
const OFPP_NORMAL: u32 = 0xffff_fffa;
/// `OFPCML_NO_BUFFER`: send the whole packet.
const NO_BUFFER_MAX_LEN: u16 = 0xffff;

/// True for the model's actions that are OpenFlow instructions of their own.
pub(crate) fn is_instruction(action: &Action) -> bool {
    matches!(action, Action::GotoTable(_) | Action::Meter(_))
}

/// Writes the instructions for `actions` in the order OpenFlow runs them: the meter, one
/// apply-actions with everything else, then the goto-table.
pub(crate) fn put_instructions(out: &mut Vec<u8>, actions: &[Action]) -> Result<(), EncodeError> {
    let mut goto = None;
    let mut meter = None;
    for action in actions {
        let duplicate = match action {
            Action::GotoTable(table) => goto.replace(*table).is_some(),
            Action::Meter(id) => meter.replace(*id).is_some(),
            _ => false,
        };
        if duplicate {
            return Err(EncodeError::Invalid(
                "more than one goto_table or meter in a flow",
            ));
        }
    }
    if let Some(id) = meter {
        out.put_u16(OFPIT_METER);
        out.put_u16(8);
        out.put_u32(id);
    }
    if actions.iter().any(|a| !is_instruction(a)) {
        let start = out.len();
        out.put_u16(OFPIT_APPLY_ACTIONS);
        out.put_u16(0);
        out.put_zeros(4);
        for action in actions {
            put_action(out, action)?;
        }
        set_len(out, start, "apply_actions instruction")?;
    }
    if let Some(table) = goto {
        out.put_u16(OFPIT_GOTO_TABLE);
        out.put_u16(8);
        out.put_u8(table);
        out.put_zeros(3);
    }
    Ok(())
}

fn set_len(out: &mut Vec<u8>, start: usize, what: &'static str) -> Result<(), EncodeError> {
    let len = u16::try_from(out.len() - start).map_err(|_| EncodeError::TooLong(what))?;
    out.set_u16(start + 2, len);
    Ok(())
}

fn put_nx_header(out: &mut Vec<u8>, subtype: u16) -> usize {
    let start = out.len();
    out.put_u16(OFPAT_EXPERIMENTER);
    out.put_u16(0);
    out.put_u32(NX_VENDOR_ID);
    out.put_u16(subtype);
    start
}

fn put_output(out: &mut Vec<u8>, port: u32) {
    out.put_u16(OFPAT_OUTPUT);
    out.put_u16(16);
    out.put_u32(port);
    out.put_u16(NO_BUFFER_MAX_LEN);
    out.put_zeros(6);
}

fn put_reg_load2<T: oxm::WireValue + crate::flow::FullMask>(
    out: &mut Vec<u8>,
    field: u8,
    value: &Masked<T>,
) -> Result<(), EncodeError> {
    let start = put_nx_header(out, NXAST_REG_LOAD2);
    oxm::put_nx_masked(out, field, value);
    out.pad_to_8(start);
    set_len(out, start, "reg_load2 action")
}

/// Writes one action (goto-table and meter are instructions and write nothing here).
pub(crate) fn put_action(out: &mut Vec<u8>, action: &Action) -> Result<(), EncodeError> {
    match action {
        Action::GotoTable(_) | Action::Meter(_) => Ok(()),
        Action::Output(port) => {
            put_output(out, *port);
            Ok(())
        }
        Action::Normal => {
            put_output(out, OFPP_NORMAL);
            Ok(())
        }
        Action::Controller { max_len, userdata } => {
            let start = put_nx_header(out, NXAST_CONTROLLER2);
            out.put_zeros(6);
            out.put_u16(NXAC2PT_MAX_LEN);
            out.put_u16(6);
            out.put_u16(*max_len);
            out.put_zeros(2);
            let prop = out.len();
            out.put_u16(NXAC2PT_USERDATA);
            let prop_len = u16::try_from(4 + userdata.len())
                .map_err(|_| EncodeError::TooLong("controller userdata"))?;
            out.put_u16(prop_len);
            out.extend_from_slice(userdata);
            out.pad_to_8(prop);
            set_len(out, start, "controller action")
        }
        Action::Conjunction {
            id,
            clause,
            n_clauses,
        } => {
            // OVS refuses conjunctions of fewer than 2 or more than 64 clauses.
            if !(2..=64).contains(n_clauses) {
                return Err(EncodeError::Invalid(
                    "conjunction n_clauses must be between 2 and 64",
                ));
            }
            if *clause == 0 || clause > n_clauses {
                return Err(EncodeError::Invalid(
                    "conjunction clause must be between 1 and n_clauses",
                ));
            }
            let start = put_nx_header(out, NXAST_CONJUNCTION);
            // The wire numbers clauses from 0; the model (like ovs-ofctl) from 1.
            out.put_u8(clause - 1);
            out.put_u8(*n_clauses);
            out.put_u32(*id);
            set_len(out, start, "conjunction action")
        }
        Action::Ct {
            commit,
            zone,
            table,
            set_mark,
            set_label,
        } => {
            let start = put_nx_header(out, NXAST_CT);
            out.put_u16(if *commit { NX_CT_F_COMMIT } else { 0 });
            out.put_u32(0); // zone_src 0: the zone is the immediate value below
            out.put_u16(*zone);
            out.put_u8(table.unwrap_or(NX_CT_RECIRC_NONE));
            out.put_zeros(3);
            out.put_u16(0); // no ALG
            if let Some(mark) = set_mark {
                put_reg_load2(out, NX_CT_MARK, mark)?;
            }
            if let Some(label) = set_label {
                put_reg_load2(out, NX_CT_LABEL, label)?;
            }
            set_len(out, start, "ct action")
        }
        Action::Resubmit { table } => {
            if *table == 0xff {
                return Err(EncodeError::Invalid("resubmit to table 255"));
            }
            let start = put_nx_header(out, NXAST_RESUBMIT_TABLE);
            out.put_u16(NX_OFPP_IN_PORT);
            out.put_u8(*table);
            out.put_zeros(3);
            set_len(out, start, "resubmit action")
        }
        Action::SetReg { reg, value, mask } => {
            if *reg >= 16 {
                return Err(EncodeError::Invalid("register number above 15"));
            }
            put_reg_load2(out, *reg, &Masked::new(*value, *mask))
        }
    }
}

/// Decodes an instruction list back into the model's action list.
pub(crate) fn read_instructions(reader: &mut Reader<'_>) -> Result<Vec<Action>, DecodeError> {
    let mut actions = Vec::new();
    let mut goto = None;
    let mut meter = None;
    while !reader.is_empty() {
        let kind = reader.u16()?;
        let len = usize::from(reader.u16()?);
        if len < 8 {
            return Err(DecodeError::BadLength {
                what: "instruction",
                length: len,
            });
        }
        let mut body = reader.sub(len - 4, "instruction")?;
        match kind {
            OFPIT_GOTO_TABLE => goto = Some(body.u8()?),
            OFPIT_METER => {
                if meter.replace(body.u32()?).is_some() {
                    return Err(DecodeError::Invalid("more than one meter instruction"));
                }
            }
            OFPIT_APPLY_ACTIONS => {
                body.skip(4)?;
                read_actions_into(&mut body, &mut actions)?;
            }
            other => {
                return Err(DecodeError::Unsupported {
                    what: "instruction",
                    value: u64::from(other),
                })
            }
        }
    }
    if let Some(id) = meter {
        // The meter runs first, so the model lists it first (as ovs-ofctl prints it).
        actions.insert(0, Action::Meter(id));
    }
    actions.extend(goto.map(Action::GotoTable));
    Ok(actions)
}

/// Decodes an action list (as in apply-actions or packet-out).
pub(crate) fn read_actions_into(
    reader: &mut Reader<'_>,
    actions: &mut Vec<Action>,
) -> Result<(), DecodeError> {
    while !reader.is_empty() {
        let (kind, mut body) = read_action_header(reader)?;
        actions.push(read_action(kind, &mut body)?);
    }
    Ok(())
}

fn read_action_header<'a>(reader: &mut Reader<'a>) -> Result<(u16, Reader<'a>), DecodeError> {
    let kind = reader.u16()?;
    let len = usize::from(reader.u16()?);
    if len < 8 {
        return Err(DecodeError::BadLength {
            what: "action",
            length: len,
        });
    }
    Ok((kind, reader.sub(len - 4, "action")?))
}

/// A reg_load2 target the model knows.
enum Load {
    Reg(u8, Masked<u32>),
    CtMark(Masked<u32>),
    CtLabel(Masked<u128>),
}

fn load_from_tlv(tlv: &Tlv<'_>) -> Result<Load, DecodeError> {
    match (tlv.class, tlv.field) {
        (0x0001, reg) if reg < 16 => Ok(Load::Reg(reg, oxm::masked(tlv)?)),
        (0x0001, NX_CT_MARK) => Ok(Load::CtMark(oxm::masked(tlv)?)),
        (0x0001, NX_CT_LABEL) => Ok(Load::CtLabel(oxm::masked(tlv)?)),
        _ => Err(DecodeError::Unsupported {
            what: "set-field destination",
            value: u64::from(oxm::oxm_header(tlv.class, tlv.field, false, 0)),
        }),
    }
}

/// The legacy `NXAST_REG_LOAD` (bit range + 64-bit value), which OVS still uses to report a
/// masked set-field with a contiguous mask.
fn read_reg_load(body: &mut Reader<'_>) -> Result<Load, DecodeError> {
    let ofs_nbits = body.u16()?;
    let dst = body.u32()?;
    let value = body.u64()?;
    let (class, field) = ((dst >> 16) as u16, ((dst >> 9) & 0x7f) as u8);
    let width: u32 = match (class, field) {
        (0x0001, reg) if reg < 16 => 32,
        (0x0001, NX_CT_MARK) => 32,
        (0x0001, NX_CT_LABEL) => 128,
        _ => {
            return Err(DecodeError::Unsupported {
                what: "reg_load destination",
                value: u64::from(dst),
            })
        }
    };
    let ofs = u32::from(ofs_nbits >> 6);
    let nbits = u32::from(ofs_nbits & 0x3f) + 1;
    if ofs + nbits > width {
        return Err(DecodeError::Invalid("reg_load bit range beyond its field"));
    }
    let mask = (u128::MAX >> (128 - nbits)) << ofs;
    let value = (u128::from(value) << ofs) & mask;
    Ok(match field {
        NX_CT_LABEL => Load::CtLabel(Masked::new(value, mask)),
        // Both fit 32 bits: the range check above bounds them by `width`.
        NX_CT_MARK => Load::CtMark(Masked::new(value as u32, mask as u32)),
        reg => Load::Reg(reg, Masked::new(value as u32, mask as u32)),
    })
}

/// Decodes any of the three encodings of "set a field" (OpenFlow set-field, Nicira reg_load and
/// reg_load2); `None` when the action is something else.
fn read_load(kind: u16, mut body: Reader<'_>) -> Result<Option<Load>, DecodeError> {
    if kind == OFPAT_SET_FIELD {
        return load_from_tlv(&oxm::read_tlv(&mut body)?).map(Some);
    }
    if kind != OFPAT_EXPERIMENTER || body.u32()? != NX_VENDOR_ID {
        return Ok(None);
    }
    match body.u16()? {
        NXAST_REG_LOAD2 => load_from_tlv(&oxm::read_tlv(&mut body)?).map(Some),
        NXAST_REG_LOAD => read_reg_load(&mut body).map(Some),
        _ => Ok(None),
    }
}

fn read_action(kind: u16, body: &mut Reader<'_>) -> Result<Action, DecodeError> {
    match read_load(kind, body.clone())? {
        Some(Load::Reg(reg, value)) => {
            return Ok(Action::SetReg {
                reg,
                value: value.value,
                mask: value.mask,
            })
        }
        Some(_) => {
            return Err(DecodeError::Unsupported {
                what: "set of a conntrack field outside ct",
                value: 0,
            })
        }
        None => {}
    }
    match kind {
        OFPAT_OUTPUT => {
            let port = body.u32()?;
            let max_len = body.u16()?;
            Ok(match port {
                OFPP_NORMAL => Action::Normal,
                port::CONTROLLER => Action::Controller {
                    max_len,
                    userdata: Vec::new(),
                },
                port => Action::Output(port),
            })
        }
        OFPAT_EXPERIMENTER => {
            let vendor = body.u32()?;
            if vendor != NX_VENDOR_ID {
                return Err(DecodeError::Unsupported {
                    what: "action experimenter",
                    value: u64::from(vendor),
                });
            }
            read_nx_action(body.u16()?, body)
        }
        other => Err(DecodeError::Unsupported {
            what: "action",
            value: u64::from(other),
        }),
    }
}

fn read_nx_action(subtype: u16, body: &mut Reader<'_>) -> Result<Action, DecodeError> {
    match subtype {
        NXAST_RESUBMIT_TABLE => {
            let in_port = body.u16()?;
            let table = body.u8()?;
            if in_port != NX_OFPP_IN_PORT || table == 0xff {
                return Err(DecodeError::Unsupported {
                    what: "resubmit form",
                    value: u64::from(in_port),
                });
            }
            Ok(Action::Resubmit { table })
        }
        NXAST_CONJUNCTION => {
            let clause = body.u8()?;
            let n_clauses = body.u8()?;
            let id = body.u32()?;
            if clause >= n_clauses {
                return Err(DecodeError::Invalid("conjunction clause >= n_clauses"));
            }
            Ok(Action::Conjunction {
                id,
                clause: clause + 1,
                n_clauses,
            })
        }
        NXAST_CT => {
            let flags = body.u16()?;
            let zone_src = body.u32()?;
            let zone = body.u16()?;
            let recirc = body.u8()?;
            body.skip(3)?;
            let alg = body.u16()?;
            if zone_src != 0 || alg != 0 || flags & !NX_CT_F_COMMIT != 0 {
                return Err(DecodeError::Unsupported {
                    what: "ct option",
                    value: u64::from(flags),
                });
            }
            let (mut set_mark, mut set_label) = (None, None);
            while !body.is_empty() {
                let (kind, nested) = read_action_header(body)?;
                match read_load(kind, nested)? {
                    Some(Load::CtMark(mark)) => set_mark = Some(mark),
                    Some(Load::CtLabel(label)) => set_label = Some(label),
                    _ => {
                        return Err(DecodeError::Unsupported {
                            what: "ct exec action",
                            value: u64::from(kind),
                        })
                    }
                }
            }
            Ok(Action::Ct {
                commit: flags & NX_CT_F_COMMIT != 0,
                zone,
                table: (recirc != NX_CT_RECIRC_NONE).then_some(recirc),
                set_mark,
                set_label,
            })
        }
        NXAST_CONTROLLER2 => {
            body.skip(6)?;
            let mut max_len = NO_BUFFER_MAX_LEN;
            let mut userdata = Vec::new();
            while !body.is_empty() {
                let kind = body.u16()?;
                let len = usize::from(body.u16()?);
                if len < 4 {
                    return Err(DecodeError::BadLength {
                        what: "controller2 property",
                        length: len,
                    });
                }
                let mut value = body.sub(len - 4, "controller2 property")?;
                body.skip((super::wire::round_up_8(len) - len).min(body.remaining()))?;
                match kind {
                    NXAC2PT_MAX_LEN => max_len = value.u16()?,
                    NXAC2PT_USERDATA => userdata = value.rest().to_vec(),
                    other => {
                        return Err(DecodeError::Unsupported {
                            what: "controller2 property",
                            value: u64::from(other),
                        })
                    }
                }
            }
            Ok(Action::Controller { max_len, userdata })
        }
        other => Err(DecodeError::Unsupported {
            what: "Nicira action",
            value: u64::from(other),
        }),
    }
}
