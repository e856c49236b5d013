#!/usr/bin/env python3
"""grpcio + PyJWT client checks run by Sluice's tunnel integration tests.

    tunnel_client.py CHECK --node HOST:PORT --agent-id N --secret-file F [--ca-file CA]

Prints one JSON object with what it observed; the Rust test asserts on it.
"""

import argparse
import asyncio
import json
import os
import sys
import threading
import time

import grpc
import jwt

MAX = 64 * 1024 * 1024
OPTIONS = [("grpc.max_receive_message_length", MAX), ("grpc.max_send_message_length", MAX)]


def token(args, **overrides):
    now = int(time.time())
    claims = {"iss": args.issuer, "aud": args.audience, "iat": now, "exp": now + args.lifetime}
    claims.update(overrides.pop("claims", {}))
    secret = overrides.pop("secret", None) or open(args.secret_file, "rb").read().strip()
    algorithm = overrides.pop("algorithm", "HS256")
    return jwt.encode(claims, secret, algorithm=algorithm)


def channel(args):
    if args.ca_file:
        credentials = grpc.ssl_channel_credentials(root_certificates=open(args.ca_file, "rb").read())
        return grpc.secure_channel(args.node, credentials, options=OPTIONS)
    return grpc.insecure_channel(args.node, options=OPTIONS)


def metadata(args, agent_id=None, bearer=None):
    return (
        ("authorization", f"Bearer {bearer or token(args)}"),
        ("sluice-agent-id", str(agent_id if agent_id is not None else args.agent_id)),
    )


def status(error):
    return {"code": error.code().name, "details": error.details()}


def shapes(args):
    ch = channel(args)
    md = metadata(args)
    out = {}
    unary = ch.unary_unary("/test.Echo/Unary")
    reply, call = unary.with_call(b"hello", metadata=md + (("x-request-id", "r-42"),), timeout=20)
    out["unary"] = reply.decode()
    out["initial_metadata"] = dict(call.initial_metadata()).get("x-request-id")
    out["trailing_metadata"] = dict(call.trailing_metadata()).get("x-trailer")
    stream = ch.unary_stream("/test.Echo/ServerStream")
    messages = [m.decode() for m in stream(b"10000", metadata=md, timeout=60)]
    out["server_stream_count"] = len(messages)
    out["server_stream_in_order"] = messages == [f"msg-{i}" for i in range(10000)]
    client = ch.stream_unary("/test.Echo/ClientStream")
    out["client_stream"] = client(iter([b"a" * i for i in range(1, 101)]), metadata=md, timeout=20).decode()
    bidi = ch.stream_stream("/test.Echo/Bidi")
    # Ping-pong: send the next message only after the previous answer arrived.
    pongs = []
    outbox = []
    ready = threading.Condition()

    def requests():
        for i in range(50):
            with ready:
                ready.wait_for(lambda: len(pongs) == i, timeout=10)
            yield f"ping-{i}".encode()

    for reply in bidi(requests(), metadata=md, timeout=30):
        with ready:
            pongs.append(reply.decode())
            ready.notify_all()
    out["bidi"] = pongs == [f"ping-{i}" for i in range(50)]
    big = ch.unary_unary("/test.Echo/Unary")
    payload = bytes(range(256)) * (16 * 1024 * 1024 // 256)
    out["big_echo"] = big(payload, metadata=md, timeout=60) == payload
    out["big_size"] = len(ch.unary_unary("/test.Echo/Size")(b"16777216", metadata=md, timeout=60))
    try:
        ch.unary_unary("/test.Echo/Fail")(b"", metadata=md, timeout=10)
        out["fail"] = None
    except grpc.RpcError as error:
        out["fail"] = status(error)
        out["fail_trailer"] = dict(error.trailing_metadata()).get("x-reason")
    return out


def cancel(args):
    ch = channel(args)
    future = ch.unary_unary("/test.Echo/Hang").future(b"", metadata=metadata(args), timeout=30)
    reached = None
    if args.cancel_when:
        # Cancel once the call is at the backend (it creates this file), not after a guess.
        deadline = time.time() + 20
        while not os.path.exists(args.cancel_when) and time.time() < deadline:
            time.sleep(0.02)
        reached = os.path.exists(args.cancel_when)
    else:
        time.sleep(args.delay)
    future.cancel()
    return {"cancelled": future.cancelled(), "reached_backend": reached}


def deadline(args):
    ch = channel(args)
    started = time.time()
    try:
        ch.unary_unary("/test.Echo/Hang")(b"", metadata=metadata(args), timeout=args.timeout)
        return {"code": "OK"}
    except grpc.RpcError as error:
        result = status(error)
        result["elapsed"] = time.time() - started
        return result


def unary_once(args):
    ch = channel(args)
    started = time.time()
    try:
        reply = ch.unary_unary("/test.Echo/Unary")(args.payload.encode(), metadata=metadata(args), timeout=args.timeout)
        return {"code": "OK", "reply": reply.decode(), "elapsed": time.time() - started, "ended_at": time.time()}
    except grpc.RpcError as error:
        result = status(error)
        result["elapsed"] = time.time() - started
        result["ended_at"] = time.time()
        return result


def slow_stream(args):
    """Server streaming with a pause per message; reports how the call ended and when."""
    ch = channel(args)
    received = 0
    try:
        for _ in ch.unary_stream("/test.Echo/ServerStream")(args.stream.encode(), metadata=metadata(args), timeout=60):
            received += 1
            if received == 5:
                print(json.dumps({"streaming": True}), flush=True)
        return {"code": "OK", "received": received, "ended_at": time.time()}
    except grpc.RpcError as error:
        result = status(error)
        result["received"] = received
        result["ended_at"] = time.time()
        return result


def auth_matrix(args):
    ch = channel(args)
    call = ch.unary_unary("/test.Echo/Unary")
    now = int(time.time())
    cases = {
        "no_token": (("sluice-agent-id", str(args.agent_id)),),
        "wrong_secret": metadata(args, bearer=token(args, secret=b"another-secret-another-secret-xx")),
        "expired": metadata(args, bearer=token(args, claims={"iat": now - 120, "exp": now - 60})),
        "wrong_issuer": metadata(args, bearer=token(args, claims={"iss": "evil"})),
        "wrong_audience": metadata(args, bearer=token(args, claims={"aud": "other"})),
        "alg_none": metadata(args, bearer=jwt.encode({"iss": "gitlab", "aud": "gitlab-kas", "iat": now, "exp": now + 30}, None, algorithm="none")),
        "agent_token": metadata(args, bearer=args.agent_token),
        "garbage": metadata(args, bearer="%%garbage%%" + "A" * 200 + "!@#$"),
    }
    results = {}
    for name, md in cases.items():
        try:
            call(b"x", metadata=md, timeout=10)
            results[name] = {"code": "OK"}
        except grpc.RpcError as error:
            results[name] = status(error)
        except Exception as error:  # grpcio refuses to send some header values at all
            results[name] = {"code": "CLIENT_REFUSED", "details": str(error)}
    for name, md in {
        "missing_agent_id": (("authorization", f"Bearer {token(args)}"),),
        "malformed_agent_id": (("authorization", f"Bearer {token(args)}"), ("sluice-agent-id", "seven")),
    }.items():
        try:
            call(b"x", metadata=md, timeout=10)
            results[name] = {"code": "OK"}
        except grpc.RpcError as error:
            results[name] = status(error)
    return results


def concurrency(args):
    async def client(index, channels, failures):
        ch = channels[index % len(channels)]
        call = ch.unary_unary("/test.Echo/Unary")
        md = metadata(args)
        for request in range(args.requests):
            payload = f"client-{index}-request-{request}".encode()
            reply = await call(payload, metadata=md, timeout=60)
            if reply != payload:
                failures.append((index, request, reply[:40].decode(errors="replace")))

    async def run():
        channels = [grpc.aio.insecure_channel(args.node, options=OPTIONS) for _ in range(args.clients)]
        failures = []
        started = time.time()
        await asyncio.gather(*(client(i, channels, failures) for i in range(args.clients)))
        for ch in channels:
            await ch.close()
        return {"calls": args.clients * args.requests, "mismatches": len(failures), "sample": failures[:3], "seconds": time.time() - started}

    return asyncio.run(run())


def steady(args):
    """Sequential unary calls for --duration seconds: when each started and ended, and how."""
    ch = channel(args)
    call = ch.unary_unary("/test.Echo/Unary")
    ok_ends, ok_elapsed, failures = [], [], []
    stop_at = time.time() + args.duration
    index = 0
    while time.time() < stop_at:
        payload = f"steady-{index}".encode()
        started = time.time()
        try:
            reply = call(payload, metadata=metadata(args), timeout=args.timeout)
            if reply == payload:
                ok_ends.append(time.time())
                ok_elapsed.append(time.time() - started)
                if len(ok_ends) == 1:
                    # A progress line before the result: a test waits for it to know the
                    # stream is under way (readers take the last line as the result).
                    print(json.dumps({"first_ok": ok_ends[0]}), flush=True)
            else:
                failures.append([started, time.time(), "MISMATCH", reply[:40].decode(errors="replace")])
        except grpc.RpcError as error:
            failures.append([started, time.time(), error.code().name, error.details()])
        index += 1
        time.sleep(args.delay)
    return {"calls": index, "ok_ends": ok_ends, "ok_elapsed": ok_elapsed, "failures": failures}


def list_agents(args):
    ch = channel(args)
    md = (("authorization", f"Bearer {token(args)}"),)
    raw = ch.unary_unary("/sluice.agents.v1.Agents/ListConnectedAgents")(b"", metadata=md, timeout=10)
    return {"bytes": raw.hex()}


def field(number, payload):
    """A length-delimited protobuf field (wire type 2); lengths below 2^14 are enough here."""
    length = len(payload)
    prefix = bytes([length]) if length < 0x80 else bytes([(length & 0x7F) | 0x80, length >> 7])
    return bytes([(number << 3) | 2]) + prefix + payload


def spliced(args):
    """A framed call on a node's private endpoint, as another node sends it: each gRPC message
    is a tunnel ConnectResponse (RequestInfo, Message, CloseSend), each reply a ConnectRequest.
    --frames: hex messages to send instead of a call of /test.Echo/Unary with --payload."""
    if args.frames:
        frames = [bytes.fromhex(frame) for frame in args.frames.split(",")]
    else:
        frames = [
            field(1, field(1, b"/test.Echo/Unary")),
            field(2, field(1, args.payload.encode())),
            field(3, b""),
        ]
    ch = channel(args)
    md = metadata(args)
    call = ch.stream_stream("/sluice.tunnel.v1.Private/Spliced")
    replies = []
    try:
        for reply in call(iter(frames), metadata=md, timeout=args.timeout):
            replies.append(reply.hex())
        return {"code": "OK", "replies": replies}
    except grpc.RpcError as error:
        result = status(error)
        result["replies"] = replies
        return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("check")
    parser.add_argument("--node", required=True)
    parser.add_argument("--agent-id", type=int, default=7)
    parser.add_argument("--secret-file", required=True)
    parser.add_argument("--ca-file")
    parser.add_argument("--agent-token", default="")
    parser.add_argument("--delay", type=float, default=1.0)
    parser.add_argument("--cancel-when", default="", help="cancel: a file whose creation means the call is at the backend")
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--payload", default="ping")
    parser.add_argument("--frames", default="", help="spliced: hex tunnel messages, comma-separated")
    parser.add_argument("--stream", default="1000:10:50", help="slow-stream's request: N:SIZE:DELAY_MS")
    parser.add_argument("--issuer", default="gitlab")
    parser.add_argument("--lifetime", type=int, default=30)
    parser.add_argument("--audience", default="gitlab-kas")
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--duration", type=float, default=10.0)
    args = parser.parse_args()
    checks = {
        "shapes": shapes,
        "cancel": cancel,
        "deadline": deadline,
        "unary": unary_once,
        "slow-stream": slow_stream,
        "auth-matrix": auth_matrix,
        "concurrency": concurrency,
        "list-agents": list_agents,
        "steady": steady,
        "spliced": spliced,
    }
    print(json.dumps(checks[args.check](args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
