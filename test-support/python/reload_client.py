#!/usr/bin/env python3
"""grpcio + PyJWT client for Sluice's config reload test (sluice/tests/reload.rs).

    reload_client.py --node HOST:PORT --agent-id N --secret-file F

Signs one JWT with the secret in F as it is at start and makes a unary call on one channel,
prints {"before": CODE}, then waits for a line on stdin (the test rotates the secret and
reloads the node meanwhile). Then, on the same channel (the same HTTP/2 connection, whose
verified-token cache saw the old token), it calls again with the old token and with a token
signed with the secret F holds now, and prints {"old_token": CODE, "new_token": CODE, ...}.
"""

import argparse
import json
import sys
import time

import grpc
import jwt


def sign(secret):
    now = int(time.time())
    claims = {"iss": "gitlab", "aud": "gitlab-kas", "iat": now, "exp": now + 50}
    return jwt.encode(claims, secret, algorithm="HS256")


def call(stub, agent_id, token):
    metadata = (("authorization", f"Bearer {token}"), ("sluice-agent-id", str(agent_id)))
    try:
        stub(b"rotate", metadata=metadata, timeout=10)
        return {"code": "OK"}
    except grpc.RpcError as error:
        return {"code": error.code().name, "details": error.details()}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--node", required=True)
    parser.add_argument("--agent-id", type=int, required=True)
    parser.add_argument("--secret-file", required=True)
    args = parser.parse_args()
    channel = grpc.insecure_channel(args.node)
    stub = channel.unary_unary("/test.Echo/Unary")
    old = sign(open(args.secret_file, "rb").read().strip())
    print(json.dumps({"before": call(stub, args.agent_id, old)["code"]}), flush=True)
    sys.stdin.readline()
    new = sign(open(args.secret_file, "rb").read().strip())
    old_after = call(stub, args.agent_id, old)
    new_after = call(stub, args.agent_id, new)
    print(
        json.dumps(
            {
                "old_token": old_after["code"],
                "old_details": old_after.get("details"),
                "new_token": new_after["code"],
                "new_details": new_after.get("details"),
            }
        ),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
