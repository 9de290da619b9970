"""Delivers a node's inbound heartbeats late, as a congested link or an on-path attacker would.

Runs in a namespace of its own that the victim's peers route the victim's address through, with
forwarding off, so nothing reaches the victim except what this script sends. It captures each
genuine, signed datagram for the victim's port (AF_PACKET: it sees the frames addressed to its
own link, which the kernel then drops for want of forwarding) and sends the same bytes on later:

  --delay S    every datagram S seconds after it was captured (a standing queue: gray failure)
  --expire S   every datagram held until S seconds after the send time it carries (its signed
               "ts"), so it arrives as late as its acceptance window allows; after SIGUSR2 new
               datagrams are dropped (an attacker who re-delivers the genuine heartbeats it
               chooses as late as they are still taken, and suppresses the rest)

Prints "ready" once capturing; on SIGTERM prints how many datagrams it captured and sent.
Standard library only.
"""
import argparse
import heapq
import json
import signal
import socket
import struct
import sys
import threading
import time

ETH_P_ALL = 0x0003
PACKET_OUTGOING = 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iface", default="eth0")
    ap.add_argument("--victim", required=True)
    ap.add_argument("--port", type=int, default=1815)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--delay", type=float)
    mode.add_argument("--expire", type=float)
    args = ap.parse_args()

    victim = socket.inet_aton(args.victim)
    raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    raw.bind((args.iface, 0))
    out = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    queue = []  # (due, n, payload)
    lock = threading.Condition()
    counts = {"captured": 0, "sent": 0}

    def report(*_):
        print(f"captured {counts['captured']} sent {counts['sent']}", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, report)
    nonlocal_seq = [0]
    dropping = [False]

    def drop_from_now(*_):
        dropping[0] = True

    signal.signal(signal.SIGUSR2, drop_from_now)

    def sender():
        while True:
            with lock:
                while not queue or queue[0][0] > time.monotonic():
                    timeout = None if not queue else queue[0][0] - time.monotonic()
                    lock.wait(timeout)
                _, _, payload = heapq.heappop(queue)
            out.sendto(payload, (args.victim, args.port))
            counts["sent"] += 1

    threading.Thread(target=sender, daemon=True).start()
    print("ready", flush=True)
    while True:
        frame, addr = raw.recvfrom(65535)
        if addr[2] == PACKET_OUTGOING or len(frame) < 14 + 20 + 8:
            continue
        if struct.unpack("!H", frame[12:14])[0] != 0x0800:
            continue
        ip = frame[14:]
        ihl = (ip[0] & 0x0F) * 4
        if ip[9] != 17 or ip[16:20] != victim:
            continue
        udp = ip[ihl:]
        if struct.unpack("!H", udp[2:4])[0] != args.port:
            continue
        length = struct.unpack("!H", udp[4:6])[0]
        payload = bytes(udp[8:length])
        if dropping[0]:
            continue
        if args.delay is not None:
            due = time.monotonic() + args.delay
        else:
            try:
                sent = json.loads(payload)["ts"] / 1e9
            except (ValueError, KeyError, TypeError):
                continue
            due = time.monotonic() + max(0.0, sent + args.expire - time.time())
        with lock:
            counts["captured"] += 1
            nonlocal_seq[0] += 1
            heapq.heappush(queue, (due, nonlocal_seq[0], payload))
            lock.notify()


if __name__ == "__main__":
    main()
