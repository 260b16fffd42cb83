#!/usr/bin/env python3
"""How long a freshly started job server takes to be ready for a client
that starts it the way Beam's PrismRunner does: spawn the binary with
`--job_port N`, open a gRPC channel to localhost:N at once, and wait until
the channel is ready (apache_beam.utils.subprocess_server's loop).

  python server_ready.py BIN [BIN...] [--starts 20]

Prints, per binary, each start's milliseconds and how many took over
half a second (a first connection attempt that found nothing listening
waits out gRPC's reconnect backoff, about a second).
"""

import argparse
import os
import subprocess
import sys
import time

import grpc

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'python'))
from refract_testlib import free_port  # pylint: disable=wrong-import-position


def ready_seconds(binary):
  port = free_port()
  t0 = time.perf_counter()
  proc = subprocess.Popen(
    [binary, '--job_port', str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
  )
  channel = grpc.insecure_channel('localhost:%d' % port)
  try:
    ready = grpc.channel_ready_future(channel)
    wait = 0.1
    while True:
      if proc.poll() is not None:
        raise RuntimeError('%s exited with %s' % (binary, proc.returncode))
      try:
        ready.result(timeout=wait)
        return time.perf_counter() - t0
      except grpc.FutureTimeoutError:
        wait *= 1.2
  finally:
    channel.close()
    proc.terminate()
    proc.wait()


def main():
  ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  ap.add_argument('binaries', nargs='+')
  ap.add_argument('--starts', type=int, default=20)
  args = ap.parse_args()
  for binary in args.binaries:
    times = [ready_seconds(binary) for _ in range(args.starts)]
    slow = sum(1 for t in times if t > 0.5)
    print(
      '%s: %d of %d starts over 0.5 s; ms: %s'
      % (binary, slow, len(times), ' '.join('%.0f' % (t * 1000) for t in times))
    )


if __name__ == '__main__':
  main()
