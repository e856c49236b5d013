#!/usr/bin/env python3
"""A real grpcio server used as the backend behind `sluice agent` in integration tests.

Methods take and return raw bytes (no protobuf), so any payload works:
  /test.Echo/Unary         echo; copies x-* request metadata to initial metadata; trailer x-trailer;
                           counted as one line in CALLS_FILE
  /test.Echo/ServerStream  request b"N[:SIZE[:DELAY_MS]]": N messages (b"msg-i" or SIZE bytes)
  /test.Echo/ClientStream  returns b"COUNT:TOTAL_BYTES" of the request stream
  /test.Echo/Bidi          echoes every message as it arrives
  /test.Echo/Size          request b"N": returns N bytes
  /test.Echo/Fail          aborts with NOT_FOUND, message "nope", trailer x-reason: test
  /test.Echo/Hang          waits up to 30 s; creates CANCEL_FILE.started when it begins (a test
                           waits for it instead of guessing) and records cancellation in CANCEL_FILE
Prints "PORT <n>" once serving.
"""

import os
import sys
import threading
import time
from concurrent import futures

import grpc

CANCEL_FILE = os.environ.get("CANCEL_FILE", "")
# Every Unary call that reaches this backend appends one line here (tests count them).
CALLS_FILE = os.environ.get("CALLS_FILE", "")
CALLS_LOCK = threading.Lock()
MAX = 64 * 1024 * 1024


def unary(request, context):
    if CALLS_FILE:
        with CALLS_LOCK, open(CALLS_FILE, "a") as handle:
            handle.write("unary\n")
    context.send_initial_metadata([(k, v) for k, v in context.invocation_metadata() if k.startswith("x-")])
    context.set_trailing_metadata([("x-trailer", "done")])
    return request


def server_stream(request, context):
    parts = request.decode().split(":")
    count = int(parts[0])
    size = int(parts[1]) if len(parts) > 1 and parts[1] else 0
    delay = int(parts[2]) / 1000.0 if len(parts) > 2 else 0
    for index in range(count):
        if delay:
            time.sleep(delay)
        yield (b"x" * size) if size else f"msg-{index}".encode()


def client_stream(request_iterator, context):
    count = 0
    total = 0
    for message in request_iterator:
        count += 1
        total += len(message)
    return f"{count}:{total}".encode()


def bidi(request_iterator, context):
    for message in request_iterator:
        yield message


def size(request, context):
    return b"s" * int(request.decode())


def fail(request, context):
    context.set_trailing_metadata([("x-reason", "test")])
    context.abort(grpc.StatusCode.NOT_FOUND, "nope")


def hang(request, context):
    if CANCEL_FILE:
        open(CANCEL_FILE + ".started", "w").close()
    cancelled = threading.Event()
    context.add_callback(cancelled.set)
    cancelled.wait(30)
    if not context.is_active() and CANCEL_FILE:
        with open(CANCEL_FILE, "w") as handle:
            handle.write("cancelled\n")
    return b"late"


def main() -> None:
    handlers = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary),
        "ServerStream": grpc.unary_stream_rpc_method_handler(server_stream),
        "ClientStream": grpc.stream_unary_rpc_method_handler(client_stream),
        "Bidi": grpc.stream_stream_rpc_method_handler(bidi),
        "Size": grpc.unary_unary_rpc_method_handler(size),
        "Fail": grpc.unary_unary_rpc_method_handler(fail),
        "Hang": grpc.unary_unary_rpc_method_handler(hang),
    }
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=64),
        handlers=[grpc.method_handlers_generic_handler("test.Echo", handlers)],
        options=[("grpc.max_receive_message_length", MAX), ("grpc.max_send_message_length", MAX)],
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(f"PORT {port}", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    sys.exit(main())
