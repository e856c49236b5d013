// SPDX-License-Identifier: Apache-2.0
/*
 * Sluice's tc counters: one program per hook (sluice_ingress, sluice_egress) sharing one body.
 * Two programs rather than one with a direction patched into .rodata at load time: the hook a
 * program sits on is then readable from its name in `bpftool prog`/`tc filter show`, and the
 * loader rewrites nothing.
 *
 * They never change a packet's fate: every path returns TC_ACT_UNSPEC (TCX_NEXT under TCX:
 * "carry on as if we were not here").
 *
 * Two parsers giving the same answers (see docs/EBPF.md, Overhead):
 * - parse_headers, the fast path: reads Ethernet, one VLAN tag, IPv4 (any ihl), IPv6 without
 *   extension headers and the TCP/UDP/ICMP header from memory, no helper call, bounds-checked
 *   for the verifier. It runs first on the skb's linear area (skb->data..skb->data_end); when a
 *   header goes past data_end (the rest is in a paged fragment: trafgen's and other zero-copy
 *   senders' frames carry only the Ethernet header in the linear area) it runs again on a copy
 *   of the first SLUICE_HDR_MAX bytes, made with one bpf_skb_load_bytes. It never calls a frame
 *   malformed for being short (PARSE_SHORT) and leaves IPv6 extension headers (PARSE_WALK) to
 *   the fallback.
 * - parse_slow, the fallback: reads header by header with bpf_skb_load_bytes, which reaches
 *   headers outside the linear area and fails only past skb->len, so "malformed" means the frame
 *   really is too short, never "the headers were in a paged fragment". It walks IPv6 extension
 *   headers.
 * Content checks (IP version, ihl, doff) are the same in both; only length decides who answers.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#include "counters.h"

/* errno values the helpers return (negated); kept here to avoid the arch-specific errno.h. */
#define SLUICE_EEXIST 17

/* How many IPv6 extension headers we walk before giving up on finding the L4 header. */
#define SLUICE_MAX_IPV6_EXT 6

#define ETH_P_8021Q_BE bpf_htons(ETH_P_8021Q)
#define ETH_P_8021AD_BE bpf_htons(ETH_P_8021AD)

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, SLUICE_MAX_COUNTER_KEYS);
	__type(key, struct sluice_key);
	__type(value, struct sluice_counts);
} sluice_counters SEC(".maps");

/* Filled by user space: destination port + protocol -> listener id (< SLUICE_MAX_LISTENERS). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SLUICE_MAX_LISTENERS);
	__type(key, struct sluice_port_key);
	__type(value, __u32);
} sluice_ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLUICE_MAX_LISTENERS);
	__type(key, __u32);
	__type(value, struct sluice_listener_counts);
} sluice_listen SEC(".maps");

/* Slot SLUICE_ERR_COUNTERS_FULL: packets not counted because sluice_counters was full. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SLUICE_ERR_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} sluice_errors SEC(".maps");

/*
 * Number of listeners in sluice_ports, set by the loader (EbpfLoader::override_global) before the
 * programs are loaded. .rodata is frozen, so the verifier sees a constant: with no listener
 * (the VM agent registers none) it removes the sluice_ports lookup from the program altogether.
 * volatile: without it clang would fold the 0 below into the code.
 */
volatile const __u32 sluice_listener_count = 0;

/* What the parser learnt about one frame. */
struct parsed {
	__u8 protocol;
	__u8 malformed;
	__u8 syn;
	__u8 has_dport;
	__u16 dport; /* host byte order */
};

static __always_inline __u8 protocol_label(__u8 proto)
{
	if (proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_ICMP ||
	    proto == IPPROTO_ICMPV6)
		return proto;
	return SLUICE_PROTO_OTHER;
}

static __always_inline void slow_l4(struct __sk_buff *skb, __u32 off, __u8 proto,
				     int later_fragment, struct parsed *p)
{
	p->protocol = protocol_label(proto);
	/* A fragment after the first carries no L4 header: count it, parse nothing. */
	if (later_fragment)
		return;
	if (proto == IPPROTO_TCP) {
		struct tcphdr tcp;
		if (bpf_skb_load_bytes(skb, off, &tcp, sizeof(tcp)) < 0 || tcp.doff < 5) {
			p->malformed = 1;
			return;
		}
		p->syn = tcp.syn && !tcp.ack;
		p->dport = bpf_ntohs(tcp.dest);
		p->has_dport = 1;
	} else if (proto == IPPROTO_UDP) {
		struct udphdr udp;
		if (bpf_skb_load_bytes(skb, off, &udp, sizeof(udp)) < 0) {
			p->malformed = 1;
			return;
		}
		p->dport = bpf_ntohs(udp.dest);
		p->has_dport = 1;
	} else if (proto == IPPROTO_ICMP || proto == IPPROTO_ICMPV6) {
		__u32 type_code_sum;
		if (bpf_skb_load_bytes(skb, off, &type_code_sum, sizeof(type_code_sum)) < 0)
			p->malformed = 1;
	}
}

static __always_inline void slow_ipv4(struct __sk_buff *skb, __u32 off, struct parsed *p)
{
	struct iphdr ip;
	if (bpf_skb_load_bytes(skb, off, &ip, sizeof(ip)) < 0 || ip.version != 4 || ip.ihl < 5) {
		p->malformed = 1;
		return;
	}
	int later_fragment = (bpf_ntohs(ip.frag_off) & 0x1fff) != 0;
	slow_l4(skb, off + ip.ihl * 4, ip.protocol, later_fragment, p);
}

static __always_inline void slow_ipv6(struct __sk_buff *skb, __u32 off, struct parsed *p)
{
	struct ipv6hdr ip6;
	if (bpf_skb_load_bytes(skb, off, &ip6, sizeof(ip6)) < 0 || ip6.version != 6) {
		p->malformed = 1;
		return;
	}
	__u8 next = ip6.nexthdr;
	int later_fragment = 0;
	off += sizeof(ip6);
#pragma unroll
	for (int i = 0; i < SLUICE_MAX_IPV6_EXT; i++) {
		/* Every extension header starts with (next header, length); lengths differ per type. */
		__u8 ext[2];
		if (next == IPPROTO_HOPOPTS || next == IPPROTO_ROUTING || next == IPPROTO_DSTOPTS) {
			if (bpf_skb_load_bytes(skb, off, ext, sizeof(ext)) < 0)
				goto truncated;
			next = ext[0];
			off += ((__u32)ext[1] + 1) * 8;
		} else if (next == IPPROTO_AH) {
			if (bpf_skb_load_bytes(skb, off, ext, sizeof(ext)) < 0)
				goto truncated;
			next = ext[0];
			off += ((__u32)ext[1] + 2) * 4;
		} else if (next == IPPROTO_FRAGMENT) {
			__u16 frag[4];
			if (bpf_skb_load_bytes(skb, off, frag, sizeof(frag)) < 0)
				goto truncated;
			next = (__u8)(bpf_ntohs(frag[0]) >> 8);
			later_fragment = (bpf_ntohs(frag[1]) & 0xfff8) != 0;
			off += sizeof(frag);
		} else if (next == IPPROTO_NONE) {
			p->protocol = SLUICE_PROTO_OTHER;
			return;
		} else {
			slow_l4(skb, off, next, later_fragment, p);
			return;
		}
	}
	/* More extension headers than we walk: counted, protocol unknown, not malformed. */
	p->protocol = SLUICE_PROTO_OTHER;
	return;
truncated:
	p->protocol = SLUICE_PROTO_OTHER;
	p->malformed = 1;
}

static __always_inline void parse_slow(struct __sk_buff *skb, struct parsed *p)
{
	struct ethhdr eth;
	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) < 0) {
		p->malformed = 1;
		return;
	}
	__u16 proto = eth.h_proto;
	__u32 off = sizeof(eth);
	/* One VLAN tag; with VLAN offload the tag is already out of the data and this is a no-op. */
	if (proto == ETH_P_8021Q_BE || proto == ETH_P_8021AD_BE) {
		__u16 vlan[2];
		if (bpf_skb_load_bytes(skb, off, vlan, sizeof(vlan)) < 0) {
			p->malformed = 1;
			return;
		}
		proto = vlan[1];
		off += sizeof(vlan);
	}
	if (proto == bpf_htons(ETH_P_IP))
		slow_ipv4(skb, off, p);
	else if (proto == bpf_htons(ETH_P_IPV6))
		slow_ipv6(skb, off, p);
}

/* parse_headers' verdicts. */
#define PARSE_DONE 0  /* *p is filled in */
#define PARSE_SHORT 1 /* a header goes past the end of what we were given */
#define PARSE_WALK 2  /* IPv6 extension headers: parse_slow walks them */

/* The most header bytes parse_headers reads: Ethernet 14 + VLAN 4 + IPv4 with options 60 + TCP
 * 20 (IPv6 needs 78). */
#define SLUICE_HDR_MAX 98

/* The L4 header at l4, read below data_end as in parse_headers; same checks as slow_l4. */
static __always_inline int direct_l4(void *l4, void *data_end, __u8 proto, int later_fragment,
				     struct parsed *p)
{
	p->protocol = protocol_label(proto);
	if (later_fragment)
		return PARSE_DONE;
	if (proto == IPPROTO_TCP) {
		struct tcphdr *tcp = l4;
		if ((void *)(tcp + 1) > data_end)
			return PARSE_SHORT;
		if (tcp->doff < 5) {
			p->malformed = 1;
			return PARSE_DONE;
		}
		p->syn = tcp->syn && !tcp->ack;
		p->dport = bpf_ntohs(tcp->dest);
		p->has_dport = 1;
	} else if (proto == IPPROTO_UDP) {
		struct udphdr *udp = l4;
		if ((void *)(udp + 1) > data_end)
			return PARSE_SHORT;
		p->dport = bpf_ntohs(udp->dest);
		p->has_dport = 1;
	} else if (proto == IPPROTO_ICMP || proto == IPPROTO_ICMPV6) {
		/* type, code, checksum: only their presence is checked */
		if (l4 + 4 > data_end)
			return PARSE_SHORT;
	}
	return PARSE_DONE;
}

/*
 * The fast path over the frame's first bytes, data..data_end (the packet itself or a copy on the
 * stack): PARSE_DONE with *p filled in, else PARSE_SHORT or PARSE_WALK with *p to be thrown
 * away. The verifier checks every read: against data_end for the packet, against the copy's
 * size (the offsets are bounded: ihl <= 15) for the stack.
 */
static __always_inline int parse_headers(void *data, void *data_end, struct parsed *p)
{
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > data_end)
		return PARSE_SHORT;
	__u16 proto = eth->h_proto;
	void *l3 = eth + 1;
	if (proto == ETH_P_8021Q_BE || proto == ETH_P_8021AD_BE) {
		__u16 *vlan = l3;
		if ((void *)(vlan + 2) > data_end)
			return PARSE_SHORT;
		proto = vlan[1];
		l3 = vlan + 2;
	}
	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = l3;
		if ((void *)(ip + 1) > data_end)
			return PARSE_SHORT;
		if (ip->version != 4 || ip->ihl < 5) {
			p->malformed = 1;
			return PARSE_DONE;
		}
		int later_fragment = (bpf_ntohs(ip->frag_off) & 0x1fff) != 0;
		/* ihl <= 15: a bounded variable offset, which the verifier accepts. */
		return direct_l4(l3 + ip->ihl * 4, data_end, ip->protocol, later_fragment, p);
	}
	if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = l3;
		if ((void *)(ip6 + 1) > data_end)
			return PARSE_SHORT;
		if (ip6->version != 6) {
			p->malformed = 1;
			return PARSE_DONE;
		}
		__u8 next = ip6->nexthdr;
		/* Extension headers are rare: the slow path walks them. */
		if (next == IPPROTO_HOPOPTS || next == IPPROTO_ROUTING || next == IPPROTO_DSTOPTS ||
		    next == IPPROTO_AH || next == IPPROTO_FRAGMENT)
			return PARSE_WALK;
		if (next == IPPROTO_NONE)
			return PARSE_DONE; /* protocol stays SLUICE_PROTO_OTHER */
		return direct_l4(ip6 + 1, data_end, next, 0, p);
	}
	return PARSE_DONE;
}

static __always_inline void parse(struct __sk_buff *skb, struct parsed *p)
{
	int verdict = parse_headers((void *)(long)skb->data, (void *)(long)skb->data_end, p);
	if (verdict == PARSE_DONE)
		return;
	if (verdict == PARSE_SHORT) {
		/* Headers in a paged fragment: one copy of the first bytes, parsed alike. The verifier
		 * counts all SLUICE_HDR_MAX bytes of hdr as written by the helper, and parse_headers
		 * reads only below hdr + len. */
		__u8 hdr[SLUICE_HDR_MAX];
		__u32 len = skb->len;
		if (len > SLUICE_HDR_MAX)
			len = SLUICE_HDR_MAX;
		if (len >= sizeof(struct ethhdr) && bpf_skb_load_bytes(skb, 0, hdr, len) == 0) {
			*p = (struct parsed){ .protocol = SLUICE_PROTO_OTHER };
			verdict = parse_headers(hdr, hdr + len, p);
			if (verdict == PARSE_DONE)
				return;
		}
	}
	/* Really short, or IPv6 extension headers: start over, header by header. */
	*p = (struct parsed){ .protocol = SLUICE_PROTO_OTHER };
	parse_slow(skb, p);
}

static __always_inline void count_map_full(void)
{
	__u32 slot = SLUICE_ERR_COUNTERS_FULL;
	__u64 *full = bpf_map_lookup_elem(&sluice_errors, &slot);
	if (full)
		*full += 1;
}

static __always_inline void count_listener(struct __sk_buff *skb, const struct parsed *p)
{
	struct sluice_port_key port = { .port = p->dport, .protocol = p->protocol };
	__u32 *id = bpf_map_lookup_elem(&sluice_ports, &port);
	if (!id)
		return;
	__u32 index = *id;
	struct sluice_listener_counts *c = bpf_map_lookup_elem(&sluice_listen, &index);
	if (!c)
		return;
	c->packets += 1;
	c->bytes += skb->len;
	c->syns += p->syn;
}

static __always_inline int count(struct __sk_buff *skb, __u8 direction)
{
	struct parsed p = { .protocol = SLUICE_PROTO_OTHER };
	parse(skb, &p);

	struct sluice_key key = {
		.ifindex = skb->ifindex,
		.direction = direction,
		.protocol = p.protocol,
	};
	struct sluice_counts *c = bpf_map_lookup_elem(&sluice_counters, &key);
	if (!c) {
		/* BPF_NOEXIST: two CPUs may insert the same key at once; the loser must not replace
		 * the winner's element (and its first count), it looks the element up again. */
		struct sluice_counts zero = {};
		long err = bpf_map_update_elem(&sluice_counters, &key, &zero, BPF_NOEXIST);
		if (err && err != -SLUICE_EEXIST) {
			count_map_full();
			goto listener;
		}
		c = bpf_map_lookup_elem(&sluice_counters, &key);
	}
	if (c) {
		/* Per-CPU values: plain adds, no atomics (tc programs do not migrate mid-run). */
		c->packets += 1;
		c->bytes += skb->len;
		c->tcp_syn += p.syn;
		c->malformed += p.malformed;
	}
listener:
	/* Both conditions are constants to the verifier: egress and a listener-less load drop
	 * this branch at load time. */
	if (direction == SLUICE_DIR_INGRESS && sluice_listener_count != 0 && p.has_dport)
		count_listener(skb, &p);
	return TC_ACT_UNSPEC;
}

SEC("classifier")
int sluice_ingress(struct __sk_buff *skb)
{
	return count(skb, SLUICE_DIR_INGRESS);
}

SEC("classifier")
int sluice_egress(struct __sk_buff *skb)
{
	return count(skb, SLUICE_DIR_EGRESS);
}

char LICENSE[] SEC("license") = "Apache-2.0";
