#!/usr/bin/env python3
"""Steady unary load through Sluice nodes from real grpcio clients, for rolling-restart tests.

    rolling_load.py --nodes H:P,H:P,H:P --agents 7,8 --secret-file F --stop-file S --progress P

One channel over every node address with grpcio's round_robin policy (the client-side load
balancing a fleet's clients use); --threads workers each call /test.Echo/Unary in a loop,
taking the agents in turn. Any status but OK counts as a failure. Until the stop file exists,
the counts are written to the progress file (atomically) every 100 ms; at the end one JSON
object goes to stdout: ok, failed, failures by code (with the first few details), per agent.
"""

import argparse
import json
import os
import threading
import time

import grpc
import jwt


def token(secret, lifetime=50):
    now = int(time.time())
    claims = {"iss": "gitlab", "aud": "gitlab-kas", "iat": now, "exp": now + lifetime}
    return jwt.encode(claims, secret, algorithm="HS256")


class Counts:
    def __init__(self, agents):
        self.lock = threading.Lock()
        self.ok = 0
        self.failed = 0
        self.codes = {}
        self.details = []
        self.per_agent = {str(agent): 0 for agent in agents}

    def success(self, agent):
        with self.lock:
            self.ok += 1
            self.per_agent[str(agent)] += 1

    def failure(self, agent, code, details):
        with self.lock:
            self.failed += 1
            self.codes[code] = self.codes.get(code, 0) + 1
            if len(self.details) < 10:
                self.details.append({"agent": agent, "code": code, "details": details, "at": time.time()})

    def snapshot(self):
        with self.lock:
            return {
                "ok": self.ok,
                "failed": self.failed,
                "codes": dict(self.codes),
                "details": list(self.details),
                "per_agent": dict(self.per_agent),
            }


def worker(index, unary, agents, secret, counts, stop):
    turn = index
    bearer, minted = token(secret), time.time()
    while not stop.is_set():
        if time.time() - minted > 30:
            bearer, minted = token(secret), time.time()
        agent = agents[turn % len(agents)]
        turn += 1
        metadata = (("authorization", f"Bearer {bearer}"), ("sluice-agent-id", str(agent)))
        payload = f"call-{index}-{turn}".encode()
        try:
            reply = unary(payload, metadata=metadata, timeout=30)
            if reply != payload:
                counts.failure(agent, "WRONG_REPLY", reply[:64].decode(errors="replace"))
            else:
                counts.success(agent)
        except grpc.RpcError as error:
            counts.failure(agent, error.code().name, error.details())


def write_progress(path, snapshot):
    temporary = path + ".tmp"
    with open(temporary, "w") as out:
        json.dump(snapshot, out)
    os.replace(temporary, path)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", required=True)
    parser.add_argument("--agents", required=True)
    parser.add_argument("--secret-file", required=True)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--progress", required=True)
    parser.add_argument("--threads", type=int, default=4)
    args = parser.parse_args()
    secret = open(args.secret_file, "rb").read().strip()
    agents = [int(agent) for agent in args.agents.split(",")]
    target = "ipv4:" + args.nodes
    # The default authority of a multi-address target is the address list, which is not a
    # valid :authority (the nodes refuse it): name the service instead.
    options = [("grpc.lb_policy_name", "round_robin"), ("grpc.default_authority", "sluice-nodes")]
    channel = grpc.insecure_channel(target, options=options)
    unary = channel.unary_unary("/test.Echo/Unary")
    counts = Counts(agents)
    stop = threading.Event()
    threads = [
        threading.Thread(target=worker, args=(i, unary, agents, secret, counts, stop), daemon=True)
        for i in range(args.threads)
    ]
    for thread in threads:
        thread.start()
    while not os.path.exists(args.stop_file):
        write_progress(args.progress, counts.snapshot())
        time.sleep(0.1)
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    channel.close()
    print(json.dumps(counts.snapshot()))


if __name__ == "__main__":
    main()
