"""The command lines Beam uses to start a runner binary must work as-is."""

import pytest

from refract_testlib import RefractServer
from refract_testlib import free_port


@pytest.mark.parametrize(
    'flags',
    [
        # Beam's PrismRunnerTest: `BIN --job_port N`.
        ['--job_port', '{port}'],
        # Python's PrismRunner (--prism_location).
        [
            '--job_port',
            '{port}',
            '--log_level',
            'info',
            '--log_kind',
            'json',
            '--serve_http=false',
        ],
        # Go-style single-dash flags, as other Beam SDKs pass them to Prism.
        [
            '-job_port={port}',
            '-serve_http=false',
            '-idle_shutdown_timeout=1h',
        ],
        ['serve', '--job_port', '{port}'],
    ],
    ids=['beam-suite', 'prism-runner', 'go-style', 'serve'])
def test_job_service_starts(request, refract_bin, tmp_path, flags):
  port = free_port()
  args = [refract_bin] + [f.format(port=port) for f in flags]
  server = RefractServer(
      refract_bin, tmp_path / 'refract.log', port=port, args=args)
  request.node.refract_processes = [server]  # log shown if the test fails
  try:
    server.wait_ready()
    assert server.proc.poll() is None
  finally:
    server.stop()


def _listening_addresses(port):
  """Local addresses with a TCP socket listening on `port`, from /proc."""
  found = []
  for path, width in (('/proc/net/tcp', 8), ('/proc/net/tcp6', 32)):
    try:
      with open(path) as f:
        lines = f.readlines()[1:]
    except OSError:
      continue
    for line in lines:
      fields = line.split()
      local, state = fields[1], fields[3]
      addr, port_hex = local.split(':')
      if state == '0A' and int(port_hex, 16) == port and len(addr) == width:
        found.append(addr)
  return found


_LOOPBACK = {
    '0100007F',  # 127.0.0.1
    '00000000000000000000000001000000',  # ::1
    '0000000000000000FFFF00000100007F',  # ::ffff:127.0.0.1
}


def test_job_port_listens_on_loopback_only(refract_server):
  addrs = _listening_addresses(refract_server.port)
  assert addrs, 'nothing listens on port %d' % refract_server.port
  assert set(addrs) <= _LOOPBACK, (
      'the job port listens beyond loopback: %s (/proc/net/tcp* hex)' % addrs)
