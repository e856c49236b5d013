//! The order an exchange's messages may come in, for both streams at once: the request side's
//! upgrade data is allowed only once the response head said 101.
//!
//! Request: Head, Data*, End. Response: Head, Data*, End. After a response Head with status
//! 101 both sides send only UpgradeData until each closes with End (the request side may have
//! ended its empty body before the 101 arrived; its next End then closes the upgraded stream).

use http::StatusCode;

use super::{CodecError, RequestMessage, ResponseMessage};

/// Which of the four messages: what the order depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageKind {
    Head,
    Data,
    End,
    UpgradeData,
}

impl MessageKind {
    fn name(self) -> &'static str {
        match self {
            Self::Head => "head",
            Self::Data => "data",
            Self::End => "end",
            Self::UpgradeData => "upgrade data",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// Nothing yet: only a head may come.
    Start,
    /// After the head: the body.
    Body,
    /// The body ended (the request side waits for the response head).
    BodyEnded,
    /// Upgraded and exchanging upgrade data.
    Upgraded,
    /// Closed: nothing more.
    Closed,
}

impl Side {
    fn when(self) -> &'static str {
        match self {
            Self::Start => "before the head",
            Self::Body => "in the body",
            Self::BodyEnded => "after end",
            Self::Upgraded => "after the 101",
            Self::Closed => "after the stream closed",
        }
    }
}

/// The state of one exchange: feed it every message of both streams as it is decoded (or
/// before it is sent); the first one out of order is an error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExchangeOrder {
    request: Side,
    response: Side,
    /// The response head was a 101: from then on both sides send only upgrade data.
    upgrade_seen: bool,
}

impl Default for ExchangeOrder {
    fn default() -> Self {
        Self::new()
    }
}

impl ExchangeOrder {
    pub fn new() -> Self {
        Self {
            request: Side::Start,
            response: Side::Start,
            upgrade_seen: false,
        }
    }

    /// Whether the response head switched protocols (101).
    pub fn upgraded(&self) -> bool {
        self.upgrade_seen
    }

    pub fn on_request(&mut self, message: &RequestMessage) -> Result<(), CodecError> {
        self.request_kind(message.kind())
    }

    pub fn on_response(&mut self, message: &ResponseMessage) -> Result<(), CodecError> {
        let status = match message {
            ResponseMessage::Head(head) => Some(head.status),
            _ => None,
        };
        self.response_kind(message.kind(), status)
    }

    /// As [`Self::on_request`], by kind (for a sender that has not built the message).
    pub fn request_kind(&mut self, kind: MessageKind) -> Result<(), CodecError> {
        let next = match (self.request, kind) {
            (Side::Start, MessageKind::Head) => Side::Body,
            (Side::Body, MessageKind::Data) if !self.upgrade_seen => Side::Body,
            (Side::Body, MessageKind::End) if !self.upgrade_seen => Side::BodyEnded,
            (Side::Body | Side::BodyEnded | Side::Upgraded, MessageKind::UpgradeData)
                if self.upgrade_seen =>
            {
                Side::Upgraded
            }
            (Side::Body | Side::BodyEnded | Side::Upgraded, MessageKind::End)
                if self.upgrade_seen =>
            {
                Side::Closed
            }
            (state, kind) => return Err(out_of_order("request", kind, state, self.upgrade_seen)),
        };
        self.request = next;
        Ok(())
    }

    /// As [`Self::on_response`], by kind; `status` is the head's.
    pub fn response_kind(
        &mut self,
        kind: MessageKind,
        status: Option<StatusCode>,
    ) -> Result<(), CodecError> {
        let next = match (self.response, kind) {
            (Side::Start, MessageKind::Head) if status == Some(StatusCode::SWITCHING_PROTOCOLS) => {
                self.upgrade_seen = true;
                Side::Upgraded
            }
            (Side::Start, MessageKind::Head) => Side::Body,
            (Side::Body, MessageKind::Data) => Side::Body,
            (Side::Body | Side::Upgraded, MessageKind::End) => Side::Closed,
            (Side::Upgraded, MessageKind::UpgradeData) => Side::Upgraded,
            (state, kind) => return Err(out_of_order("response", kind, state, self.upgrade_seen)),
        };
        self.response = next;
        Ok(())
    }
}

fn out_of_order(side: &'static str, kind: MessageKind, state: Side, upgraded: bool) -> CodecError {
    let when = match (kind, upgraded) {
        (MessageKind::UpgradeData, false) if state != Side::Start => "without a 101",
        (MessageKind::Data, true) => "after the 101",
        _ => state.when(),
    };
    CodecError::OutOfOrder {
        side,
        message: kind.name(),
        when,
    }
}

#[cfg(test)]
mod tests;
