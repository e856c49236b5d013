use bytes::Bytes;
use http::{HeaderMap, Method, StatusCode};

use super::super::{CodecError, RequestHead, RequestMessage, ResponseHead, ResponseMessage};
use super::*;

fn response_head(status: StatusCode) -> ResponseMessage {
    ResponseMessage::Head(ResponseHead {
        status,
        headers: HeaderMap::new(),
    })
}

fn request_head() -> RequestMessage {
    RequestMessage::Head(RequestHead {
        method: Method::GET,
        path: "/".into(),
        headers: HeaderMap::new(),
        assertion: String::new(),
    })
}

fn data() -> Bytes {
    Bytes::from_static(b"x")
}

#[test]
fn an_ordinary_exchange_is_in_order() {
    let mut order = ExchangeOrder::new();
    order.on_request(&request_head()).unwrap();
    order.on_request(&RequestMessage::Data(data())).unwrap();
    order.on_request(&RequestMessage::Data(data())).unwrap();
    order.on_request(&RequestMessage::End).unwrap();
    order.on_response(&response_head(StatusCode::OK)).unwrap();
    order.on_response(&ResponseMessage::Data(data())).unwrap();
    order.on_response(&ResponseMessage::End).unwrap();
    assert!(!order.upgraded());
}

#[test]
fn the_head_comes_first_and_once() {
    for first in [
        RequestMessage::Data(data()),
        RequestMessage::End,
        RequestMessage::UpgradeData(data()),
    ] {
        let error = ExchangeOrder::new().on_request(&first).unwrap_err();
        assert_eq!(error.reason(), "out_of_order", "{first:?}");
    }
    for first in [
        ResponseMessage::Data(data()),
        ResponseMessage::End,
        ResponseMessage::UpgradeData(data()),
    ] {
        assert!(
            ExchangeOrder::new().on_response(&first).is_err(),
            "{first:?}"
        );
    }
    let mut order = ExchangeOrder::new();
    order.on_request(&request_head()).unwrap();
    assert!(order.on_request(&request_head()).is_err());
    order.on_response(&response_head(StatusCode::OK)).unwrap();
    assert!(order.on_response(&response_head(StatusCode::OK)).is_err());
}

#[test]
fn nothing_comes_after_end() {
    let mut order = ExchangeOrder::new();
    order.on_request(&request_head()).unwrap();
    order.on_request(&RequestMessage::End).unwrap();
    assert_eq!(
        order.on_request(&RequestMessage::Data(data())),
        Err(CodecError::OutOfOrder {
            side: "request",
            message: "data",
            when: "after end"
        })
    );
    assert!(order.on_request(&RequestMessage::End).is_err());
    order.on_response(&response_head(StatusCode::OK)).unwrap();
    order.on_response(&ResponseMessage::End).unwrap();
    for next in [
        ResponseMessage::Data(data()),
        ResponseMessage::End,
        response_head(StatusCode::OK),
    ] {
        assert!(order.on_response(&next).is_err(), "{next:?}");
    }
}

#[test]
fn upgrade_data_only_after_a_101() {
    let mut order = ExchangeOrder::new();
    order.on_request(&request_head()).unwrap();
    assert_eq!(
        order.on_request(&RequestMessage::UpgradeData(data())),
        Err(CodecError::OutOfOrder {
            side: "request",
            message: "upgrade data",
            when: "without a 101"
        })
    );
    order.on_response(&response_head(StatusCode::OK)).unwrap();
    assert!(order
        .on_response(&ResponseMessage::UpgradeData(data()))
        .is_err());
    assert!(order
        .on_request(&RequestMessage::UpgradeData(data()))
        .is_err());
}

#[test]
fn after_a_101_both_sides_send_only_upgrade_data_until_they_close() {
    for request_ended_first in [false, true] {
        let mut order = ExchangeOrder::new();
        order.on_request(&request_head()).unwrap();
        if request_ended_first {
            order.on_request(&RequestMessage::End).unwrap();
        }
        order
            .on_response(&response_head(StatusCode::SWITCHING_PROTOCOLS))
            .unwrap();
        assert!(order.upgraded());
        assert!(order.on_request(&RequestMessage::Data(data())).is_err());
        assert!(order.on_response(&ResponseMessage::Data(data())).is_err());
        order
            .on_request(&RequestMessage::UpgradeData(data()))
            .unwrap();
        order
            .on_response(&ResponseMessage::UpgradeData(data()))
            .unwrap();
        order
            .on_request(&RequestMessage::UpgradeData(data()))
            .unwrap();
        order.on_response(&ResponseMessage::End).unwrap();
        assert!(order
            .on_response(&ResponseMessage::UpgradeData(data()))
            .is_err());
        // Each side closes on its own: the client may still be sending.
        order
            .on_request(&RequestMessage::UpgradeData(data()))
            .unwrap();
        order.on_request(&RequestMessage::End).unwrap();
        assert!(order
            .on_request(&RequestMessage::UpgradeData(data()))
            .is_err());
    }
}

#[test]
fn kinds_are_checked_the_same_way_before_building_a_message() {
    let mut order = ExchangeOrder::default();
    assert!(order.request_kind(MessageKind::Data).is_err());
    order.request_kind(MessageKind::Head).unwrap();
    order
        .response_kind(MessageKind::Head, Some(StatusCode::SWITCHING_PROTOCOLS))
        .unwrap();
    order.request_kind(MessageKind::UpgradeData).unwrap();
    assert_eq!(RequestMessage::End.kind(), MessageKind::End);
    assert_eq!(
        ResponseMessage::UpgradeData(data()).kind(),
        MessageKind::UpgradeData
    );
}
