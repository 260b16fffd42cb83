"""The Kubernetes manifests in docs/deploy/ are read by no test cluster
here, so what can be checked on one machine is: they are valid YAML with
the kinds the docs describe, and the refract container's arguments are
flags `refract serve` takes — a server started with them serves and lists
the pools the manifests name —, it names each pool Service by its name and
port, the Java pool's arguments start `refract worker-pool`, which with the
manifests' token variable refuses calls without the token and does not hand
it to the boot program, and only the server's pods may call the pools."""

import os
import subprocess
import time

import grpc
import pytest
import yaml
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.portability.api import beam_fn_api_pb2_grpc
from apache_beam.portability.api import endpoints_pb2

from refract_testlib import RefractServer
from refract_testlib import free_port
from refract_testlib import serving

HERE = os.path.dirname(os.path.abspath(__file__))
DEPLOY = os.path.join(os.path.dirname(os.path.dirname(HERE)), 'docs', 'deploy')


def documents(name):
  with open(os.path.join(DEPLOY, name)) as f:
    return [d for d in yaml.safe_load_all(f) if d]


def the(kind, name, manifest):
  (found,) = [d for d in documents(manifest) if d['kind'] == kind and d['metadata']['name'] == name]
  return found


def shard_host_labels():
  return the('StatefulSet', 'refract-shard', 'refract-shards.yaml')['spec']['template']['metadata'][
    'labels'
  ]


def refract_container():
  (deployment,) = [
    d
    for d in documents('refract.yaml')
    if d['kind'] == 'Deployment' and d['metadata']['name'] == 'refract'
  ]
  (container,) = deployment['spec']['template']['spec']['containers']
  return container


def test_each_manifest_is_kubernetes_yaml_of_the_kinds_documented():
  kinds = {
    name: sorted(d['kind'] for d in documents(name))
    for name in os.listdir(DEPLOY)
    if name.endswith('.yaml')
  }
  assert kinds['refract.yaml'] == ['Deployment', 'Namespace', 'PersistentVolumeClaim', 'Service']
  assert kinds['refract-shards.yaml'] == [
    'Deployment',
    'NetworkPolicy',
    'PersistentVolumeClaim',
    'Service',
    'Service',
    'StatefulSet',
  ]
  for name, found in kinds.items():
    if name.endswith('-pool.yaml'):
      assert found == ['Deployment', 'NetworkPolicy', 'Service'], name
      (service,) = [d for d in documents(name) if d['kind'] == 'Service']
      # Headless: the pool Service's name resolves to every pool pod.
      assert service['spec']['clusterIP'] == 'None', name


def test_the_refract_containers_arguments_start_a_server_with_those_pools(
  request, refract_bin, tmp_path
):
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
    refract_bin,
    tmp_path / 'serve.log',
    extra_args=args + ['--serve_http=false'],
    env=container_env(container),
  )
  with serving(request, server):
    listed = subprocess.run(
      [refract_bin, 'pools', 'list', '--job_endpoint', server.endpoint],
      capture_output=True,
      text=True,
      timeout=60,
      check=True,
    ).stdout
  specs = [a.split('=', 1)[1] for a in args if a.startswith('--worker_pool=')]
  assert specs, args
  for spec in specs:
    assert spec in listed, listed


TOKEN = 'a-token-for-the-test-of-the-manifests'


def secret_env(container):
  """The container's variables that come from Secrets: name -> (Secret,
  key)."""
  return {
    e['name']: (e['valueFrom']['secretKeyRef']['name'], e['valueFrom']['secretKeyRef']['key'])
    for e in container.get('env', [])
    if 'secretKeyRef' in e.get('valueFrom', {})
  }


def container_env(container):
  """This process's environment with the container's Secret variables,
  each set to the test's token."""
  env = dict(os.environ)
  env.update({name: TOKEN for name in secret_env(container)})
  return env


def test_the_server_and_the_java_pools_share_one_token_secret():
  (server_token,) = secret_env(refract_container()).items()
  java, _ = pool_manifests()['java-pool.yaml']
  (pool_token,) = secret_env(java).items()
  assert server_token == pool_token == ('REFRACT_POOL_TOKEN', ('refract-pool-token', 'token')), (
    server_token,
    pool_token,
  )


def test_only_the_server_and_the_shard_hosts_may_call_the_pools():
  (deployment,) = [d for d in documents('refract.yaml') if d['kind'] == 'Deployment']
  server_labels = deployment['spec']['template']['metadata']['labels']
  for name in ['java-pool.yaml', 'python-pool.yaml']:
    docs = documents(name)
    (pool,) = [d for d in docs if d['kind'] == 'Deployment']
    (policy,) = [d for d in docs if d['kind'] == 'NetworkPolicy']
    spec = policy['spec']
    assert spec['podSelector']['matchLabels'] == pool['spec']['template']['metadata']['labels'], (
      name
    )
    assert spec['policyTypes'] == ['Ingress'], name
    (rule,) = spec['ingress']
    sources = [source['podSelector']['matchLabels'] for source in rule['from']]
    assert sources == [server_labels, shard_host_labels()], name
    assert rule['ports'] == [{'port': 'pool'}], name


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
  flags = [
    a.split('=', 1)[1] for a in refract_container()['args'] if a.startswith('--worker_pool=')
  ]
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


def test_the_java_pools_arguments_start_a_refract_worker_pool(refract_bin, tmp_path):
  """With the manifest's arguments and its token variable: a call without
  the token is refused, one with it runs the boot program, which does not
  inherit the token."""
  container, _ = pool_manifests()['java-pool.yaml']
  assert container['command'] == ['/pool/refract']
  args = container['args']
  assert args[0] == 'worker-pool'
  port = free_port()
  # This machine's own address and port, and for the image's boot program
  # one that writes down its environment.
  boot = tmp_path / 'boot'
  boot.write_text('#!/bin/sh\nenv > "%s"\n' % (tmp_path / 'boot-env'))
  boot.chmod(0o755)
  args = [
    {'--host=0.0.0.0': '--host=127.0.0.1', '--boot=/opt/apache/beam/boot': '--boot=%s' % boot}.get(
      a, a
    )
    for a in args
  ]
  args = ['--port=%d' % port if a.startswith('--port=') else a for a in args]
  log = tmp_path / 'pool.log'
  with open(log, 'w') as out:
    proc = subprocess.Popen(
      [refract_bin] + args, stdout=out, stderr=subprocess.STDOUT, env=container_env(container)
    )
  try:
    deadline = time.monotonic() + 30
    while 'worker pool listening' not in log.read_text():
      assert proc.poll() is None, log.read_text()
      assert time.monotonic() < deadline, log.read_text()
      time.sleep(0.1)
    assert 'no --token_file' not in log.read_text(), log.read_text()
    endpoint = endpoints_pb2.ApiServiceDescriptor(url='127.0.0.1:1')
    request = beam_fn_api_pb2.StartWorkerRequest(
      worker_id='w1', control_endpoint=endpoint, provision_endpoint=endpoint
    )
    with grpc.insecure_channel('127.0.0.1:%d' % port) as channel:
      pool = beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolStub(channel)
      with pytest.raises(grpc.RpcError) as refused:
        pool.StartWorker(request, timeout=10)
      assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
      started = pool.StartWorker(request, timeout=10, metadata=[('x-refract-pool-token', TOKEN)])
      assert started.error == '', started.error
    deadline = time.monotonic() + 30
    while not (tmp_path / 'boot-env').exists():
      assert time.monotonic() < deadline, log.read_text()
      time.sleep(0.1)
    time.sleep(0.2)  # written by then
    assert TOKEN not in (tmp_path / 'boot-env').read_text()
  finally:
    proc.terminate()
    proc.wait(timeout=20)
  assert proc.returncode == 0, log.read_text()


def substituted(args, values):
  """`args` with each of `values`' keys replaced by its value."""
  out = []
  for arg in args:
    for old, new in values.items():
      arg = arg.replace(old, new)
    out.append(arg)
  return out


def test_the_shard_manifests_start_a_coordinator_and_a_host_that_attaches(
  request, refract_bin, tmp_path
):
  """The coordinator's and the shard StatefulSet's arguments, with this
  machine's addresses, ports and paths: the host attaches under its pod's
  name, proving the secret both mount, and says where it is reached."""
  deployment = the('Deployment', 'refract-coordinator', 'refract-shards.yaml')
  (coordinator,) = deployment['spec']['template']['spec']['containers']
  statefulset = the('StatefulSet', 'refract-shard', 'refract-shards.yaml')
  (host,) = statefulset['spec']['template']['spec']['containers']
  service = the('Service', 'refract-coordinator', 'refract-shards.yaml')
  (shards_port,) = [p for p in service['spec']['ports'] if p['name'] == 'shards']
  secret = tmp_path / 'secret'
  secret.write_text('a-cluster-secret-for-the-manifest-test\n')
  secret.chmod(0o600)
  coordinator_port, exchange_port = free_port(), free_port()
  values = {
    '/etc/refract/cluster/secret': str(secret),
    '/var/lib/refract/state': str(tmp_path / 'state'),
    '0.0.0.0:%d' % shards_port['port']: '127.0.0.1:%d' % coordinator_port,
    'refract-coordinator.refract.svc.cluster.local:%d' % shards_port['port']: '127.0.0.1:%d'
    % coordinator_port,
    '$(POD_NAME).refract-shard.refract.svc.cluster.local:8200': '127.0.0.1:%d' % exchange_port,
    '0.0.0.0:8200': '127.0.0.1:%d' % exchange_port,
    '$(POD_NAME)': 'refract-shard-0',
    '$(POD_IP)': '127.0.0.1',
    '--host=0.0.0.0': '--host=127.0.0.1',
  }
  assert coordinator['args'][0] == 'serve'
  server = RefractServer(
    refract_bin,
    tmp_path / 'coordinator.log',
    extra_args=substituted(coordinator['args'][1:], values) + ['--serve_http=false'],
  )
  assert host['args'][0] == 'shard'
  log = tmp_path / 'host.log'
  with serving(request, server), open(log, 'w') as out:
    proc = subprocess.Popen(
      [refract_bin] + substituted(host['args'], values),
      stdout=out,
      stderr=subprocess.STDOUT,
      env=container_env(host),
    )
    try:
      deadline = time.monotonic() + 30
      while 'a shard host attached' not in server.log_tail(10**6):
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, (server.log_tail(), log.read_text())
        time.sleep(0.1)
      attached = [line for line in server.log_tail(10**6).splitlines() if 'attached' in line]
      assert 'name=refract-shard-0' in attached[0], attached
      assert 'exchange=127.0.0.1:%d' % exchange_port in attached[0], attached
    finally:
      proc.terminate()
      proc.wait(timeout=20)
