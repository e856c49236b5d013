#!/usr/bin/env python3
"""Writes the seed corpus under fuzz/corpus/<target>/ from the crates' fixtures and hand-built
valid messages. Run from anywhere; idempotent (file names are content hashes)."""
import base64, hashlib, json, os, struct, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "fuzz", "corpus")


def put(target, data):
    if isinstance(data, str):
        data = data.encode()
    d = os.path.join(CORPUS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def fixture(path):
    with open(os.path.join(ROOT, path), "rb") as f:
        return f.read()


# --- protobuf helpers -----------------------------------------------------------------------
def varint(n):
    out = b""
    while n >= 0x80:
        out += bytes([(n & 0x7F) | 0x80])
        n >>= 7
    return out + bytes([n])


def field(num, wire, payload):
    key = varint((num << 3) | wire)
    if wire == 0:
        return key + varint(payload)
    return key + varint(len(payload)) + payload


def ld(num, payload):
    return field(num, 2, payload if isinstance(payload, bytes) else payload.encode())


def grpc(body, compressed=0):
    return bytes([compressed]) + struct.pack(">I", len(body)) + body


# grpc-timeout
for v in ["1S", "100m", "99999999H", "5n", "250u", "2M", "1H", "0m"]:
    put("grpc_timeout", v)

# gRPC frames (first byte: chunk size)
put("grpc_frame", b"\x03" + grpc(b"hello") + grpc(b"", 1) + grpc(b"x" * 40))
put("grpc_frame", b"\x00" + grpc(b"\x0a\x03abc"))
put("grpc_frame", b"\x0f" + grpc(b"partial")[:-2])

# tunnel protobuf (first byte: mode, see tunnel_proto.rs)
meta = ld(1, "content-type") + ld(2, b"application/grpc")
descriptor = ld(1, ld(1, "sluice.test.Echo") + ld(2, "0.1.0") + field(3, 0, 1))
header = ld(2, ld(1, meta))
message = ld(3, ld(1, b"\x00\x00\x00\x00\x02hi") + field(2, 0, 1))
trailer = ld(4, field(1, 0, 5) + ld(2, "not found") + ld(3, meta))
error = ld(5, field(1, 0, 14) + ld(2, "unavailable"))
request_info = ld(1, ld(1, "/sluice.test.Echo/Say") + ld(2, meta))
resp_message = ld(2, ld(1, b"payload"))
close_send = ld(3, b"")
agents = ld(1, field(1, 0, 7) + field(2, 0, 1) + ld(3, "0.1.0") + ld(4, "node-a") + field(5, 0, 1700000000000))
for mode, body in [(0x80, descriptor), (0x83, header), (0x81, message), (0xC0, trailer), (0x8F, error),
                   (0x00, request_info), (0x05, resp_message), (0x40, close_send), (0x00, agents)]:
    put("tunnel_proto", bytes([mode]) + body)
put("tunnel_proto", b"\x82" + grpc(descriptor) + grpc(header) + grpc(message) + grpc(trailer))
put("tunnel_proto", b"\x02" + grpc(request_info) + grpc(resp_message) + grpc(close_send))

# authorization / JWT (mode 0: raw header; else claims to sign)
put("tunnel_auth", b"\x00Bearer agent-token")
put("tunnel_auth", b"\x00bearer eyJhbGciOiJIUzI1NiJ9.eyJleHAiOjF9.c2ln")
put("tunnel_auth", b"\x00Basic dXNlcjpwYXNz")
put("tunnel_auth", b"\x01" + json.dumps({"exp": 4102444800, "iat": 4102444700, "iss": "sluice", "aud": "sluice-tunnel"}).encode())
put("tunnel_auth", b"\x01" + json.dumps({"exp": 1, "iat": 0, "iss": "sluice", "aud": ["sluice-tunnel", "x"], "nbf": 0}).encode())
put("tunnel_auth", b"\x01" + json.dumps({"exp": 2000000000, "iat": 1000000000, "iss": "other", "aud": "sluice-tunnel"}).encode())

# request info
for line in ["GET /api/v1/namespaces", "GET /api/v1/namespaces/other/pods/foo/log?follow=true",
             "GET /apis/apps/v1/namespaces/default/deployments?watch=true&fieldSelector=metadata.name%3Dweb",
             "DELETE /api/v1/namespaces/other/pods", "POST /apis/batch/v1/namespaces/ns/jobs",
             "GET /api/v1/watch/namespaces/other/pods", "GET /api/v1/namespaces/x/%73ecrets",
             "PATCH /api/v1/proxy/namespaces/ns/services/svc/a/b", "GET /healthz",
             "GET /api/v1/namespaces/ns/pods?fieldSelector=metadata.name%3Dp%2Cspec.nodeName%3Dn&watch=1"]:
    put("request_info", line)

# upgrade heads
put("upgrade_head", "GET /api/v1/namespaces/ns/pods/p/exec?command=sh&stdin=true HTTP/1.1\r\nHost: gw\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n")
put("upgrade_head", "GET /api HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\n\r\n")
put("upgrade_head", "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\r\n")
put("upgrade_head", "HTTP/1.1 403 Forbidden\r\ncontent-length: 2\r\n\r\nno")

# admin heads
put("admin_head", "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
put("admin_head", "HEAD /readyz?verbose HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
put("admin_head", "GET /livez HTTP/1.1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
put("admin_head", "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")

# UpstreamCluster YAML
put("cluster_yaml", fixture("dataplane/gateway/tests/fixtures/cluster.yaml"))
# The same cluster with its second server behind agent 42's tunnel.
put("cluster_yaml", fixture("dataplane/gateway/tests/fixtures/cluster.yaml").replace(b"  - endpoint: https://10.0.0.2:6443", b"  - agent: {id: 42}", 1))

# policy YAML / JSON (first byte: even = YAML, odd = JSON)
policy = fixture("vm-datapath/policy/tests/fixtures/three-vms.yaml")
put("policy_yaml", b"\x00" + policy)
try:
    import yaml
    put("policy_yaml", b"\x01" + json.dumps(yaml.safe_load(policy)).encode())
except ImportError:
    pass

# Redis entries
for v in ["1700000000000|10.0.0.1:8155", "123|[fd00::1]:8155", "0|", "x|y", "garbage"]:
    put("redis_entry", v)

# OVSDB JSON-RPC (first byte: chunk size and expected result count)
put("ovsdb_json", b"\x47" + json.dumps({"id": 1, "result": [{}, {"uuid": ["uuid", "0b5f5a4e-2c55-4b1a-9bb6-1f4d6ef1f0a1"]}], "error": None}).encode())
put("ovsdb_json", b"\x23" + json.dumps({"id": 2, "result": [{"error": "constraint violation", "details": "no"}], "error": None}).encode())
put("ovsdb_json", b"\x05" + json.dumps({"id": "echo", "method": "echo", "params": []}).encode() + b"\n" + json.dumps({"id": 3, "result": [{"rows": [{"name": "br0", "_uuid": ["uuid", "x"]}]}], "error": None}).encode())

# OpenFlow (OF1.3 = 4, OF1.4 = 5)
def of(version, msg_type, xid, body=b""):
    return struct.pack(">BBHI", version, msg_type, 8 + len(body), xid) + body


def oxm(field_num, value, cls=0x8000):
    return struct.pack(">HBB", cls, field_num << 1, len(value)) + value


def match(*fields):
    body = b"".join(fields)
    m = struct.pack(">HH", 1, 4 + len(body)) + body
    return m + b"\x00" * ((8 - len(m) % 8) % 8)


output = struct.pack(">HHIH6x", 0, 16, 2, 0xFFFF)
apply_actions = struct.pack(">HH4x", 4, 8 + len(output)) + output
goto = struct.pack(">HHB3x", 1, 8, 1)
m = match(oxm(0, struct.pack(">I", 1)), oxm(5, struct.pack(">H", 0x0800)), oxm(11, bytes([10, 0, 0, 1])))
flow_mod = struct.pack(">QQBBHHHIIIH2x", 0x1234, 0, 0, 0, 0, 0, 100, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0) + m + apply_actions + goto
for version in (4, 5):
    put("openflow", of(version, 0, 1, struct.pack(">HHI", 1, 8, 0x30)))  # hello + version bitmap
    put("openflow", of(version, 2, 2, b"ping"))  # echo request
    put("openflow", of(version, 5, 3))  # features request
    put("openflow", of(version, 6, 4, struct.pack(">QIBB2xII", 0xABC, 0, 254, 0, 0x4F, 0)))  # features reply
    put("openflow", of(version, 14, 5, flow_mod))
    put("openflow", of(version, 20, 6))  # barrier request
    put("openflow", of(version, 1, 7, struct.pack(">HH", 4, 9) + of(version, 20, 8)))  # error
    # flow stats request: multipart type 1 (flow)
    put("openflow", of(version, 18, 9, struct.pack(">HH4xB3xII4xQQ", 1, 0, 0xFF, 0xFFFFFFFF, 0xFFFFFFFF, 0, 0) + match()))
    # packet out
    put("openflow", of(version, 13, 10, struct.pack(">IIH6x", 0xFFFFFFFF, 1, len(output)) + output + b"\xff" * 14))
    # packet in: buffer, total_len, reason, table, cookie, match(in_port), pad, frame
    put("openflow", of(version, 10, 11, struct.pack(">IHBBQ", 0xFFFFFFFF, 14, 1, 0, 0) + match(oxm(0, struct.pack(">I", 3))) + b"\x00\x00" + b"\x02" * 14))
    # flow stats reply with one entry
    entry_match = match(oxm(0, struct.pack(">I", 1)))
    entry = struct.pack(">HBxIIHHHH4xQQQ", 0, 0, 1, 2, 100, 0, 0, 0, 0x1234, 5, 500) + entry_match + apply_actions
    entry = struct.pack(">H", len(entry)) + entry[2:]
    put("openflow", of(version, 19, 12, struct.pack(">HH4x", 1, 0) + entry))
    # meter mod (modify meter 1: pktps|burst|stats, one drop band) and meter stats request/reply
    put("openflow", of(version, 29, 16, struct.pack(">HHI", 1, 0x0E, 1) + struct.pack(">HHII4x", 1, 16, 100, 200)))
    put("openflow", of(version, 18, 17, struct.pack(">HH4xI4x", 9, 0, 1)))
    meter_stats = struct.pack(">IH6xIQQII", 1, 56, 1, 300, 30000, 3, 0) + struct.pack(">QQ", 100, 10000)
    put("openflow", of(version, 19, 18, struct.pack(">HH4x", 9, 0) + meter_stats))
    # flow mod whose Reject flow goes through meter 1 first
    meter_instruction = struct.pack(">HHI", 6, 8, 1)
    put("openflow", of(version, 14, 19, flow_mod[:40] + m + meter_instruction + apply_actions))
# bundle control (1.4 native) and bundle add wrapping a flow mod
put("openflow", of(5, 33, 13, struct.pack(">IHH", 1, 0, 3)))
inner = of(5, 14, 14, flow_mod)
put("openflow", of(5, 34, 14, struct.pack(">I2xH", 1, 3) + inner))
# Nicira / ONF experimenter (1.3 bundle control extension)
put("openflow", of(4, 4, 15, struct.pack(">II", 0x4F4E4600, 2300) + struct.pack(">IHH", 1, 0, 3)))

# Reject: Ethernet frames a VM sends into a Reject rule
def csum(data):
    if len(data) % 2:
        data += b"\x00"
    s = sum(struct.unpack(">%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def ipv4(proto, payload, src=bytes([10, 0, 0, 1]), dst=bytes([10, 0, 0, 2]), frag=0):
    h = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 1, frag, 64, proto, 0, src, dst)
    h = h[:10] + struct.pack(">H", csum(h)) + h[12:]
    return h + payload


def ipv6(nh, payload, src=bytes.fromhex("fd000000000000000000000000000001"), dst=bytes.fromhex("fd000000000000000000000000000002")):
    return struct.pack(">IHBB16s16s", 0x60000000, len(payload), nh, 64, src, dst) + payload


eth = bytes.fromhex("0200000000020200000000 01".replace(" ", ""))
tcp_syn = struct.pack(">HHIIBBHHH", 40000, 443, 1000, 0, 0x50, 0x02, 65535, 0, 0)
udp = struct.pack(">HHHH", 40000, 53, 12, 0) + b"dns!"
icmp_echo = struct.pack(">BBHHH", 8, 0, 0, 1, 1) + b"ping"
put("reject_packet", eth + b"\x08\x00" + ipv4(6, tcp_syn))
put("reject_packet", eth + b"\x08\x00" + ipv4(17, udp))
put("reject_packet", eth + b"\x08\x00" + ipv4(1, icmp_echo))
put("reject_packet", eth + b"\x81\x00\x00\x64\x08\x00" + ipv4(6, tcp_syn))
put("reject_packet", eth + b"\x86\xdd" + ipv6(6, tcp_syn))
put("reject_packet", eth + b"\x86\xdd" + ipv6(17, udp))
put("reject_packet", eth + b"\x86\xdd" + ipv6(0, b"\x11\x00\x00\x00\x00\x00\x00\x00" + udp))  # hop-by-hop then UDP
put("reject_packet", eth + b"\x86\xdd" + ipv6(44, b"\x06\x00\x00\x01\x00\x00\x00\x01" + tcp_syn))  # fragment header

# VM objects: what agents write and the VMManager reads
put("vm_objects", b'{"apiVersion":"vm.sluice.dev/v1alpha1","kind":"VirtualMachine","metadata":{"name":"vm1","resourceVersion":"7"},"spec":{"management":"Agented","uplink":{"name":"eth0","ips":["10.0.0.2/24"]}},"status":{"state":"AgentedConnected","lastHeartbeat":"2026-11-26T05:00:00Z","conditions":[{"type":"AgentConnected","status":"True","reason":"HeartbeatReceived","lastTransitionTime":"2026-11-26T05:00:00Z"}]}}')
put("vm_objects", b'{"apiVersion":"vm.sluice.dev/v1alpha1","kind":"VirtualMachineRuntimeInfo","metadata":{"name":"vm1"},"agentState":"Active","os":"linux","agentVersion":"0.1.0","networkPolicies":{"web":"3"},"conditions":[{"type":"OVSDBConnected","status":"True","reason":"Connected"}],"reportedAt":"2026-11-26T05:00:00.123Z"}')
put("vm_objects", b'{"metadata":{"name":"web"},"spec":{"appliedTo":["g"],"members":[{"name":"eth0","vm":"vm1"}],"rules":[{"peers":{"addressGroups":["a"]}}]}}')

# The main config file: the embedded defaults, a node's packaged config, and small documents.
put("config_file", fixture("foundation/config/src/embedded_defaults.yaml"))
put("config_file", fixture("deploy/debian/node.yaml"))
put("config_file", "tunnel:\n  max_connections_per_agent: 4\n  list_page_size: 0\n")
put("config_file", "admin:\n  listen: 127.0.0.1:9\nunknown: 1\n")

# Tunnel node inputs (first byte: decoder, see tunnel_node.rs)
put("tunnel_node", b"\x00" + b"42/7/node-a")
put("tunnel_node", b"\x00" + b"1/-3/node/with/slashes")
put("tunnel_node", b"\x01" + struct.pack("<qq", 42, 7) + b"node-a")
put("tunnel_node", b"\x02" + b"123\n0.1.0")
put("tunnel_node", b"\x02" + b"0007\n")
put("tunnel_node", b"\x03" + ld(1, "sluice.test.Echo") + ld(1, "grpc.health.v1.Health") + ld(2, "0.1.0") + field(3, 0, 1))
put("tunnel_node", b"\x04" + b"agent 7 not connected: 100%25 h%C3%A9llo %zz %4")

# DER client certificates (self-signed, P-256; made once with openssl req -x509): CN and O.
CERTS = {
    "alice, O=system:masters, O=dev": "MIIBwjCCAWmgAwIBAgIUdecg7m54SWktiSVUtz1X5BWdjKwwCgYIKoZIzj0EAwIwNzEOMAwGA1UEAwwFYWxpY2UxFzAVBgNVBAoMDnN5c3RlbTptYXN0ZXJzMQwwCgYDVQQKDANkZXYwHhcNMjYxMTI4MjIyMjMxWhcNMzYxMTI1MjIyMjMxWjA3MQ4wDAYDVQQDDAVhbGljZTEXMBUGA1UECgwOc3lzdGVtOm1hc3RlcnMxDDAKBgNVBAoMA2RldjBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABKU+36eaYZbra6AsV11uhp2SmUqV47MqMWFSS4YafEnB24heQan0i1e479d2yIVDcEZZ+uQ9q/UBmFf7xxzxdAujUzBRMB0GA1UdDgQWBBRgiwtwDjf99/Al8oweWclMTSj/qDAfBgNVHSMEGDAWgBRgiwtwDjf99/Al8oweWclMTSj/qDAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0cAMEQCIHPqtZE98NV+lmtgx+paPN5TkqPghOhBxCzRJeAir7ylAiAvd5Cex8IKC2HivNfdpFxUto8soYVspvIgM+BRd3jAcQ==",
    "gw-1, O=gateway": "MIIBlzCCAT2gAwIBAgIULByoBIiRmfJPln1kFY9Ge+WyCI0wCgYIKoZIzj0EAwIwITENMAsGA1UEAwwEZ3ctMTEQMA4GA1UECgwHZ2F0ZXdheTAeFw0yNjExMjgyMjIyMzFaFw0zNjExMjUyMjIyMzFaMCExDTALBgNVBAMMBGd3LTExEDAOBgNVBAoMB2dhdGV3YXkwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAAT4ecJcRft8FdTD7HOsu8ahHNmdRPltNn2SW2RnBzG/2baDsKqAOup+azxbidgwGFS8N/Rf5pObjtm3/q7zfzWdo1MwUTAdBgNVHQ4EFgQU2k6/qLyx4iyYS7FExCnXM9U38i0wHwYDVR0jBBgwFoAU2k6/qLyx4iyYS7FExCnXM9U38i0wDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNIADBFAiEAua7T03tEytCVEMC3mSLulvu25B60UBSxdmzkF18AVFMCICWkZxiKH1Ppx/S2FGPNTkbXysdYsW05gaelLUUhdTp5",
    "node-a, O=node, O=admin": "MIIBtjCCAVugAwIBAgIUUH6pwrNQLymANBejC69n3kl4ybcwCgYIKoZIzj0EAwIwMDEPMA0GA1UEAwwGbm9kZS1hMQ0wCwYDVQQKDARub2RlMQ4wDAYDVQQKDAVhZG1pbjAeFw0yNjExMjgyMjIyMzFaFw0zNjExMjUyMjIyMzFaMDAxDzANBgNVBAMMBm5vZGUtYTENMAsGA1UECgwEbm9kZTEOMAwGA1UECgwFYWRtaW4wWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAAQFSDFlU/94evqKLqu8iJ5Vk8NqNjWUGxdepwem4v5ssEQrRkfVOssR6Dd5VVVCkTsM9N8RbhmLeyL1JDA5La5Do1MwUTAdBgNVHQ4EFgQUeYKAqx8kVT3rsrG9Y5qEcMziN+cwHwYDVR0jBBgwFoAUeYKAqx8kVT3rsrG9Y5qEcMziN+cwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNJADBGAiEAvqADbD22GcvdIiU/6d0VCyLpSU8+7bTsq0URKDKx2KMCIQCam5dS6/3TKCxTO/KsI6yAb+cNRjXD0eR3XbO8bQLoGg==",
    "no CN, O=vm-agent": "MIIBezCCASGgAwIBAgIUYJk+E4Axi5OCwObLnhSwa8c2APEwCgYIKoZIzj0EAwIwEzERMA8GA1UECgwIdm0tYWdlbnQwHhcNMjYxMTI4MjIyMjMxWhcNMzYxMTI1MjIyMjMxWjATMREwDwYDVQQKDAh2bS1hZ2VudDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABK1YivBVAb+RmrDrpz/07vFeiFDNW19ETxzyFdiL9twn+FmIQXYZ0Edke1PNSMHT7zxftQOTrcOBpp82nKTB2CCjUzBRMB0GA1UdDgQWBBTKp4zCXFku9BBqD7Fb8275hqLh0zAfBgNVHSMEGDAWgBTKp4zCXFku9BBqD7Fb8275hqLh0zAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0gAMEUCIQCSVn7E+izycRCtCOigkel0NXmJLtaaozXoOoKPOWPhVAIgWsuXuKQVQFE3wh02XoiImR/BeZE/tKHI9UjQYMJJQ3s=",
}
for der in CERTS.values():
    put("gateway_review", b"\x01" + base64.b64decode(der))
    put("controlplane_input", b"\x02" + base64.b64decode(der))

# Gateway identity inputs (first byte: decoder, see gateway_review.rs)
put("gateway_review", b"\x00" + b'{"status":{"authenticated":true,"user":{"username":"alice","uid":"1","groups":["dev"],"extra":{"scopes":["a"]}}}}')
put("gateway_review", b"\x00" + b'{"status":{"allowed":true,"reason":"RBAC"}}')
put("gateway_review", b"\x02" + b"X_Remote_User: admin\nImpersonate-Group: system:masters\nimpersonate_uid: 0\nx-remote-extra-scopes: a\nAuthorization: Bearer t\naccept: */*")
for path in ["ca.pem", "sub/token", "in/token", "out/secret", "secret", "host", "../outside/secret", "/etc/hostname", "./sub/../ca.pem"]:
    put("gateway_review", b"\x03" + path.encode())
put("gateway_review", b"\x04" + b"eyJhbGciOiJSUzI1NiJ9.e30.c2ln")

# Control-plane inputs (first byte: decoder, see controlplane_input.rs)
put("controlplane_input", b"\x00" + b'{"kind":"AgentList","metadata":{"resourceVersion":"12","continue":"c"},"items":[{"metadata":{"name":"a","namespace":"n","resourceVersion":"11"}},{"metadata":{"name":"b","resourceVersion":"12"}}]}')
put("controlplane_input", b"\x01" + b'{"apiVersion":"sluice.dev/v1alpha1","kind":"Token","metadata":{"name":"gw-1"},"spec":{"role":"gateway","subject":"gw-1","tokenSha256":"' + b"ab" * 32 + b'"}}')
put("controlplane_input", b"\x01" + b'{"apiVersion":"sluice.dev/v1alpha1","kind":"Agent","metadata":{"name":"agent-7"},"spec":{"id":7,"tokenSha256":"' + b"0f" * 32 + b'"}}')

# Uplink record in a Port's external_ids (first byte: form, see uplink_record.rs)
UPLINK = {
    "sluice-uplink": "eth0",
    "sluice-uplink-mac": "02:00:ab:cd:ef:01",
    "sluice-uplink-mtu": "9000",
    "sluice-uplink-ips": "10.1.2.3/24,2001:db8::3/64",
    "sluice-uplink-ips-nobrd": "10.1.2.3/24",
    "sluice-uplink-routes": json.dumps([{"dst": "0.0.0.0/0", "gw": "10.1.2.1", "metric": 100, "scope": 0, "proto": 4}, {"dst": "10.1.2.0/24", "scope": 253, "proto": 2}]),
    "sluice-uplink-sysctls": "rp_filter=2,arp_ignore=1,disable_ipv6=0",
}
put("uplink_record", b"\x00" + json.dumps(["map", [[k, v] for k, v in UPLINK.items()]]).encode())
put("uplink_record", b"\x01" + "\n".join(f"{k}={v}" for k, v in UPLINK.items()).encode())
put("uplink_record", b"\x00" + b'["map",[["sluice-internal","true"]]]')

# Kubernetes API through the tunnel (first byte: bit 0 tight bounds, see kube_tunnel_messages.rs):
# the same bytes are read as a request, a response, order events and signed claims.
kube_headers = ld(3, ld(1, "accept") + ld(2, b"application/json")) + ld(3, ld(1, "impersonate-user") + ld(2, b"admin"))
for mode in [b"\x00", b"\x01"]:
    put("kube_tunnel_messages", mode + ld(1, ld(1, "GET") + ld(2, "/api/v1/pods?watch=1") + kube_headers + ld(4, "a.b.c")))
    put("kube_tunnel_messages", mode + ld(2, ld(1, b'{"kind":"Pod"}')))
    put("kube_tunnel_messages", mode + ld(3, b""))
    put("kube_tunnel_messages", mode + ld(4, ld(1, b"\x00stdin")))
    put("kube_tunnel_messages", mode + ld(1, field(1, 0, 200) + ld(2, ld(1, "content-type") + ld(2, b"application/json"))))
    put("kube_tunnel_messages", mode + ld(1, field(1, 0, 101) + ld(2, ld(1, "upgrade") + ld(2, b"SPDY/3.1"))))
put("kube_tunnel_messages", b"\x00" + bytes([0x80, 0x81, 0x82, 0x00, 0x01, 0x02]))
put("kube_tunnel_messages", b"\x00" + bytes([0x80, 0x82, 0x04, 0x83, 0x03, 0x83, 0x02, 0x82]))
put("kube_tunnel_messages", b"\x00" + b'{"user":"bob","uid":"1","groups":["dev"],"extra":{"scopes":["view"]}}')
put("kube_tunnel_messages", b"\x00" + b'{"exp":1800000061,"iat":1800000000}')
put("kube_tunnel_messages", b"\x00" + b'{"aud":"sluice-agent:43","jti":"AAAAAAAAAAAAAAAAAAAAAA"}')
put("kube_tunnel_messages", b"\x00" + b"eyJhbGciOiJFZERTQSJ9.e30.c2ln")

total = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(CORPUS) for f in fs)
print(f"corpus: {total} bytes", file=sys.stderr)
