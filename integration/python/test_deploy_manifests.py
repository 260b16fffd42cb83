"""The Kubernetes manifests in docs/deploy/ are read by no test cluster
here, so what can be checked on one machine is: they are valid YAML with
the kinds the docs describe, and the refract container's arguments are
flags `refract serve` takes — a server started with them serves and lists
the pools the manifests name —, it names each pool Service by its name and
port, and the Java pool's arguments start `refract worker-pool`."""

import os
import socket
import subprocess
import time

import yaml

from refract_testlib import RefractServer
from refract_testlib import free_port
from refract_testlib import serving

HERE = os.path.dirname(os.path.abspath(__file__))
DEPLOY = os.path.join(os.path.dirname(os.path.dirname(HERE)), 'docs', 'deploy')


def documents(name):
  with open(os.path.join(DEPLOY, name)) as f:
    return [d for d in yaml.safe_load_all(f) if d]


def refract_container():
  (deployment,) = [
      d for d in documents('refract.yaml')
      if d['kind'] == 'Deployment' and d['metadata']['name'] == 'refract'
  ]
  (container,) = deployment['spec']['template']['spec']['containers']
  return container


def test_each_manifest_is_kubernetes_yaml_of_the_kinds_documented():
  kinds = {
      name: sorted(d['kind'] for d in documents(name))
      for name in os.listdir(DEPLOY) if name.endswith('.yaml')
  }
  assert kinds['refract.yaml'] == [
      'Deployment', 'Namespace', 'PersistentVolumeClaim', 'Service'
  ]
  for name, found in kinds.items():
    if name.endswith('-pool.yaml'):
      assert found == ['Deployment', 'Service'], name
      (service,) = [d for d in documents(name) if d['kind'] == 'Service']
      # Headless: the pool Service's name resolves to every pool pod.
      assert service['spec']['clusterIP'] == 'None', name


def test_the_refract_containers_arguments_start_a_server_with_those_pools(
    request, refract_bin, tmp_path):
  container = refract_container()
  args = container['args']
  assert args[0] == 'serve'
  # What Kubernetes substitutes, and this machine's own ports and paths.
  args = [
      a.replace('$(POD_IP)', '127.0.0.1')
      .replace('/var/lib/refract/state', str(tmp_path / 'state'))
      .replace('=8075', '=%d' % free_port())
      for a in args[1:]
  ]
  server = RefractServer(
      refract_bin, tmp_path / 'serve.log', extra_args=args + [
          '--serve_http=false'
      ])
  with serving(request, server):
    listed = subprocess.run(
        [refract_bin, 'pools', 'list', '--job_endpoint', server.endpoint],
        capture_output=True, text=True, timeout=60, check=True).stdout
  specs = [a.split('=', 1)[1] for a in args if a.startswith('--worker_pool=')]
  assert specs, args
  for spec in specs:
    assert spec in listed, listed


def pool_manifests():
  """Pool manifest name -> (its Deployment's container, its Service)."""
  found = {}
  for name in sorted(os.listdir(DEPLOY)):
    if name.endswith('-pool.yaml'):
      docs = documents(name)
      (deployment,) = [d for d in docs if d['kind'] == 'Deployment']
      (service,) = [d for d in docs if d['kind'] == 'Service']
      (container,) = deployment['spec']['template']['spec']['containers']
      found[name] = (container, service)
  return found


def test_the_server_names_each_pool_service_by_its_name_and_port():
  flags = [a.split('=', 1)[1] for a in refract_container()['args']
           if a.startswith('--worker_pool=')]
  named = {}
  for flag in flags:
    sdk, address = flag.split('=', 1)
    host, port = address.rsplit(':', 1)
    named[host.split('.')[0]] = (sdk, int(port))
  pools = pool_manifests()
  assert sorted(pools) == ['java-pool.yaml', 'python-pool.yaml'], pools
  for name, (container, service) in pools.items():
    sdk = name.split('-')[0]
    service_name = service['metadata']['name']
    (port,) = service['spec']['ports']
    assert named.get(service_name) == (sdk, port['port']), (name, named)
    (container_port,) = container['ports']
    assert container_port['name'] == port['targetPort'], name


def test_the_java_pools_arguments_start_a_refract_worker_pool(
    refract_bin, tmp_path):
  container, _ = pool_manifests()['java-pool.yaml']
  assert container['command'] == ['/pool/refract']
  args = container['args']
  assert args[0] == 'worker-pool'
  port = free_port()
  # This machine's own address, port and an executable for the image's
  # boot program.
  args = [
      {'--host=0.0.0.0': '--host=127.0.0.1',
       '--boot=/opt/apache/beam/boot': '--boot=/bin/true'}.get(a, a)
      for a in args
  ]
  args = ['--port=%d' % port if a.startswith('--port=') else a for a in args]
  log = tmp_path / 'pool.log'
  with open(log, 'w') as out:
    proc = subprocess.Popen([refract_bin] + args, stdout=out,
                            stderr=subprocess.STDOUT)
  try:
    deadline = time.monotonic() + 30
    while 'worker pool listening' not in log.read_text():
      assert proc.poll() is None, log.read_text()
      assert time.monotonic() < deadline, log.read_text()
      time.sleep(0.1)
    socket.create_connection(('127.0.0.1', port), timeout=5).close()
  finally:
    proc.terminate()
    proc.wait(timeout=20)
  assert proc.returncode == 0, log.read_text()
