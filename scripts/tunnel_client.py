#!/usr/bin/env python3
"""Calls a gRPC method on an agent through a Sluice node's external endpoint.

Any method works with the demo echo backend (`sluice up`): the payload is sent as raw bytes and
the reply printed. Needs grpcio and PyJWT (scripts/test.sh puts both in .venv).

    .venv/bin/python scripts/tunnel_client.py --node 127.0.0.1:8151 --agent-id 1 \
        --jwt-secret-file /tmp/sluice-up-1234/jwt.secret hello
"""

import argparse
import sys
import time

import grpc
import jwt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--node", required=True, help="external endpoint, host:port")
    parser.add_argument("--agent-id", required=True, type=int)
    parser.add_argument("--jwt-secret-file", required=True)
    parser.add_argument("--issuer", default="gitlab")
    parser.add_argument("--audience", default="gitlab-kas")
    parser.add_argument("--method", default="/sluice.demo.Echo/Say")
    parser.add_argument("--ca-file", help="use TLS, trusting this CA")
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("message", nargs="?", default="hello through the tunnel")
    args = parser.parse_args()

    with open(args.jwt_secret_file, "rb") as handle:
        secret = handle.read().strip()
    now = int(time.time())
    token = jwt.encode({"iss": args.issuer, "aud": args.audience, "iat": now, "exp": now + 30}, secret, algorithm="HS256")
    if args.ca_file:
        with open(args.ca_file, "rb") as handle:
            channel = grpc.secure_channel(args.node, grpc.ssl_channel_credentials(root_certificates=handle.read()))
    else:
        channel = grpc.insecure_channel(args.node)
    call = channel.unary_unary(args.method)
    metadata = (("authorization", f"Bearer {token}"), ("sluice-agent-id", str(args.agent_id)))
    try:
        reply = call(args.message.encode(), metadata=metadata, timeout=args.timeout)
    except grpc.RpcError as error:
        print(f"{error.code().name}: {error.details()}", file=sys.stderr)
        return 1
    print(reply.decode(errors="replace"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
