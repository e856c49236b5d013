/* SPDX-License-Identifier: (Apache-2.0 OR GPL-2.0-only) */
/*
 * Map layouts shared by counters.bpf.c and, as #[repr(C)] twins, by ebpf/src/layout.rs.
 * Change both together: the Rust unit tests assert the sizes and offsets below.
 */
#ifndef SLUICE_COUNTERS_H
#define SLUICE_COUNTERS_H

#include <linux/types.h>

#define SLUICE_MAX_COUNTER_KEYS 16384
#define SLUICE_MAX_LISTENERS 64

#define SLUICE_DIR_INGRESS 0
#define SLUICE_DIR_EGRESS 1

/* L4 protocol in a key: the IANA number for the protocols we name, SLUICE_PROTO_OTHER for the
 * rest (non-IP frames, other IP protocols, IPv6 with too many extension headers). */
#define SLUICE_PROTO_OTHER 255

/* Index of each slot in the sluice_errors per-CPU array. */
#define SLUICE_ERR_COUNTERS_FULL 0
#define SLUICE_ERR_SLOTS 4

/* sluice_counters key: 8 bytes, no implicit padding (the hash compares every byte). */
struct sluice_key {
	__u32 ifindex;
	__u8 direction;
	__u8 protocol;
	__u16 pad;
};

/* sluice_counters value, one per CPU. */
struct sluice_counts {
	__u64 packets;
	__u64 bytes;     /* skb->len: the whole frame from the Ethernet header on */
	__u64 tcp_syn;   /* TCP segments with SYN set and ACK clear: connection attempts */
	__u64 malformed; /* headers cut short or inconsistent (see docs/EBPF.md) */
};

/* sluice_ports key: a listener's destination port (host byte order) and L4 protocol. */
struct sluice_port_key {
	__u16 port;
	__u8 protocol;
	__u8 pad;
};

/* sluice_listen value (per CPU), indexed by the listener id sluice_ports maps to. */
struct sluice_listener_counts {
	__u64 packets;
	__u64 bytes;
	__u64 syns;
};

#endif
