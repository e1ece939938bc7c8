#!/usr/bin/env python3
"""Mirror copies of a RoCE mix, as switches and Linux's gretap/erspan devices send
them, written to a pcap for tests/tests/mirror_e2e.rs (scapy's GRE, ERSPAN_II,
ERSPAN_III and BTH layers; addresses from 198.18.0.0/15 and 2001:db8::/32).

Sessions: GRE (transparent Ethernet bridging) with a key, GRE without one over IPv6,
ERSPAN II, ERSPAN III, ERSPAN III with the platform subheader over IPv6, and ERSPAN II
and III copies truncated to 64, 128 and 256 bytes with T set. Mirrored: plain RoCE over
IPv4 and IPv6, RoCE in VXLAN, and ICMP (a copy without RoCE).

Usage: craft_mirrors.py OUT.pcap
"""
import sys

from scapy.contrib.erspan import ERSPAN_II, ERSPAN_III, ERSPAN_PlatformSpecific
from scapy.contrib.roce import BTH
from scapy.layers.inet import ICMP, IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import GRE, Ether
from scapy.layers.vxlan import VXLAN
from scapy.packet import Raw
from scapy.utils import wrpcap

ROCE_PORT = 4791
WRITE_ONLY = 0x0A  # RC RDMA WRITE ONLY
SEND_ONLY = 0x04  # RC SEND ONLY


def roce4(src, dst, qp, psn, payload, tos=0x6A):
    return (
        Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
        / IP(src=src, dst=dst, tos=tos, flags="DF")
        / UDP(sport=49152, dport=ROCE_PORT, chksum=0)
        / BTH(opcode=SEND_ONLY, dqpn=qp, psn=psn)
        / Raw(bytes(range(256)) * (payload // 256) + bytes(range(payload % 256)))
    )


def roce6(src, dst, qp, psn, payload):
    return (
        Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
        / IPv6(src=src, dst=dst, tc=0x6A)
        / UDP(sport=49153, dport=ROCE_PORT)
        / BTH(opcode=SEND_ONLY, dqpn=qp, psn=psn)
        / Raw(bytes(payload))
    )


def roce_in_vxlan(qp, psn, payload):
    inner = roce4("198.19.0.1", "198.19.0.2", qp, psn, payload)
    return (
        Ether(src="02:00:00:00:00:11", dst="02:00:00:00:00:12")
        / IP(src="198.18.1.1", dst="198.18.1.2", tos=0x6A)
        / UDP(sport=50000, dport=4789, chksum=0)
        / VXLAN(vni=5001, flags=0x08)
        / inner
    )


def icmp():
    return (
        Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
        / IP(src="198.18.0.1", dst="198.18.0.2")
        / ICMP()
        / Raw(b"x" * 32)
    )


def outer4(src):
    return Ether(src="02:00:00:00:09:01", dst="02:00:00:00:09:02") / IP(
        src=src, dst="198.18.9.254", proto=47
    )


def outer6(src):
    return Ether(src="02:00:00:00:09:01", dst="02:00:00:00:09:02") / IPv6(
        src=src, dst="2001:db8:9::fe", nh=47
    )


def gre_teb(outer, key, seq):
    if key is None:
        return outer / GRE(proto=0x6558, seqnum_present=1, seqence_number=seq)
    return outer / GRE(
        proto=0x6558, key_present=1, key=key, seqnum_present=1, seqence_number=seq
    )


def erspan2(outer, session, seq, truncated=0):
    return outer / GRE(proto=0x88BE, seqnum_present=1, seqence_number=seq) / ERSPAN_II(
        session_id=session, en=3, t=truncated, index=0x1234
    )


def erspan3(outer, session, seq, truncated=0, platform=False):
    h = outer / GRE(proto=0x22EB, seqnum_present=1, seqence_number=seq) / ERSPAN_III(
        session_id=session, t=truncated, timestamp=seq * 100, gra=1, hw=1, o=int(platform)
    )
    if platform:
        h = h / ERSPAN_PlatformSpecific(platf_id=3, info1=0, info2=seq)
    return h


def main(out):
    frames = []
    seq = 0

    def copy(header, mirrored, keep=None):
        nonlocal seq
        seq += 1
        m = bytes(mirrored)
        if keep is not None:
            m = m[:keep]
        frames.append(header / Raw(m))

    # Whole copies: each session mirrors a few flows, several packets each.
    sessions = [
        lambda s: gre_teb(outer4("198.18.9.1"), 7, s),
        lambda s: gre_teb(outer6("2001:db8:9::1"), None, s),
        lambda s: erspan2(outer4("198.18.9.2"), 100, s),
        lambda s: erspan3(outer4("198.18.9.3"), 200, s),
        lambda s: erspan3(outer6("2001:db8:9::3"), 201, s, platform=True),
    ]
    for i, session in enumerate(sessions):
        for n in range(3 + i):
            copy(session(seq), roce4("198.18.0.1", "198.18.0.2", 0x100 + i, n, 64 + 32 * i))
            copy(session(seq), roce6("2001:db8::1", "2001:db8::2", 0x200 + i, n, 100))
            copy(session(seq), roce_in_vxlan(0x300 + i, n, 48))
        copy(session(seq), icmp())
    # Truncated copies (T set): counted with the mirrored frame's original length.
    big = roce4("198.18.0.5", "198.18.0.6", 0x400, 0, 1000)
    big6 = roce6("2001:db8::5", "2001:db8::6", 0x401, 0, 1000)
    for keep in (64, 128, 256):
        copy(erspan2(outer4("198.18.9.4"), 300, seq, truncated=1), big, keep)
        copy(erspan3(outer4("198.18.9.4"), 301, seq, truncated=1), big, keep)
        copy(erspan2(outer4("198.18.9.4"), 300, seq, truncated=1), big6, keep)
    wrpcap(out, frames)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
