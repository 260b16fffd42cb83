package org.refract.examples;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.beam.fn.harness.FnHarness;
import org.apache.beam.model.fnexecution.v1.BeamFnApi.StartWorkerRequest;
import org.apache.beam.model.fnexecution.v1.BeamFnApi.StartWorkerResponse;
import org.apache.beam.model.fnexecution.v1.BeamFnApi.StopWorkerRequest;
import org.apache.beam.model.fnexecution.v1.BeamFnApi.StopWorkerResponse;
import org.apache.beam.model.fnexecution.v1.BeamFnExternalWorkerPoolGrpc.BeamFnExternalWorkerPoolImplBase;
import org.apache.beam.model.fnexecution.v1.ProvisionApi;
import org.apache.beam.model.fnexecution.v1.ProvisionServiceGrpc;
import org.apache.beam.model.pipeline.v1.Endpoints;
import org.apache.beam.sdk.fn.channel.AddHarnessIdInterceptor;
import org.apache.beam.sdk.fn.channel.ManagedChannelFactory;
import org.apache.beam.sdk.fn.server.FnService;
import org.apache.beam.sdk.fn.server.GrpcFnServer;
import org.apache.beam.sdk.fn.server.ServerFactory;
import org.apache.beam.vendor.grpc.v1p69p0.com.google.protobuf.util.JsonFormat;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.ManagedChannel;
import org.apache.beam.vendor.grpc.v1p69p0.io.grpc.stub.StreamObserver;
import org.apache.beam.vendor.guava.v32_1_2_jre.com.google.common.collect.ImmutableList;

/**
 * A worker pool for EXTERNAL environments that runs every SDK worker as a JVM of its own, as
 * Beam's Java container does in worker-pool mode (its Go boot program forks one harness process
 * per StartWorker).
 *
 * <p>Beam's {@code org.apache.beam.fn.harness.ExternalWorkerService} runs workers as threads of
 * its own JVM, all handed the pool's one PipelineOptions object, and so one scheduled executor
 * ({@code ExecutorOptions.getScheduledExecutorService()}), which {@code FnHarness.main} shuts down
 * when its worker ends. After the first worker ends (its runner was killed, say) every other
 * worker of that pool, and every one started later, fails with RejectedExecutionException: such a
 * pool cannot outlive a runner restart. Here a worker that ends takes only its own JVM along.
 *
 * <p>{@code java -cp CP org.refract.examples.ProcessWorkerPool PORT} listens on localhost:PORT;
 * workers run with the same classpath (which must hold the pipelines' classes) and write to this
 * process's stdout and stderr. A worker's options, endpoints and the runner's capabilities come
 * from the runner's provision service, as the Go boot program fetches them.
 */
public final class ProcessWorkerPool extends BeamFnExternalWorkerPoolImplBase
    implements FnService {
  private final Map<String, Process> workers = new ConcurrentHashMap<>();
  private final String workerHeap;

  private ProcessWorkerPool(String workerHeap) {
    this.workerHeap = workerHeap;
  }

  public static void main(String[] args) throws Exception {
    if (args.length < 1) {
      System.err.println("usage: ProcessWorkerPool PORT [WORKER_HEAP, e.g. 512m]");
      System.exit(2);
    }
    String address = "localhost:" + Integer.parseInt(args[0]);
    ProcessWorkerPool pool = new ProcessWorkerPool(args.length > 1 ? args[1] : "512m");
    Runtime.getRuntime().addShutdownHook(new Thread(pool::stopAll));
    try (GrpcFnServer<ProcessWorkerPool> server =
        GrpcFnServer.create(
            pool,
            Endpoints.ApiServiceDescriptor.newBuilder().setUrl(address).build(),
            ServerFactory.createDefault())) {
      System.out.println("worker pool listening on " + server.getApiServiceDescriptor().getUrl());
      Thread.currentThread().join();
    }
  }

  @Override
  public void startWorker(
      StartWorkerRequest request, StreamObserver<StartWorkerResponse> responseObserver) {
    String id = request.getWorkerId();
    try {
      Process previous = workers.remove(id);
      if (previous != null) {
        // A runner started again reuses its worker ids; the old process served the old runner.
        previous.destroyForcibly();
      }
      workers.put(id, launch(request));
      System.out.println("started worker " + id);
      responseObserver.onNext(StartWorkerResponse.getDefaultInstance());
    } catch (Exception e) {
      System.out.println("could not start worker " + id + ": " + e);
      responseObserver.onNext(StartWorkerResponse.newBuilder().setError(e.toString()).build());
    }
    responseObserver.onCompleted();
  }

  @Override
  public void stopWorker(
      StopWorkerRequest request, StreamObserver<StopWorkerResponse> responseObserver) {
    Process worker = workers.remove(request.getWorkerId());
    if (worker != null) {
      worker.destroy();
    }
    responseObserver.onNext(StopWorkerResponse.getDefaultInstance());
    responseObserver.onCompleted();
  }

  @Override
  public void close() {
    stopAll();
  }

  private void stopAll() {
    for (Process worker : workers.values()) {
      worker.destroyForcibly();
    }
    workers.clear();
  }

  private Process launch(StartWorkerRequest request) throws IOException {
    Endpoints.ApiServiceDescriptor control = request.getControlEndpoint();
    Endpoints.ApiServiceDescriptor logging = request.getLoggingEndpoint();
    String options = "{}";
    List<String> capabilities = new ArrayList<>();
    if (request.hasProvisionEndpoint()) {
      ManagedChannel channel =
          ManagedChannelFactory.createDefault()
              .withInterceptors(ImmutableList.of(AddHarnessIdInterceptor.create(request.getWorkerId())))
              .forDescriptor(request.getProvisionEndpoint());
      try {
        ProvisionApi.ProvisionInfo info =
            ProvisionServiceGrpc.newBlockingStub(channel)
                .getProvisionInfo(ProvisionApi.GetProvisionInfoRequest.getDefaultInstance())
                .getInfo();
        options = JsonFormat.printer().print(info.getPipelineOptions());
        capabilities.addAll(info.getRunnerCapabilitiesList());
        if (info.hasControlEndpoint()) {
          control = info.getControlEndpoint();
        }
        if (info.hasLoggingEndpoint()) {
          logging = info.getLoggingEndpoint();
        }
      } finally {
        channel.shutdownNow();
      }
    }
    ProcessBuilder builder =
        new ProcessBuilder(
            ProcessHandle.current().info().command().orElse("java"),
            "-Xmx" + workerHeap,
            "-cp",
            System.getProperty("java.class.path"),
            Worker.class.getName());
    Map<String, String> env = builder.environment();
    env.put("HARNESS_ID", request.getWorkerId());
    // FnHarness reads the endpoints as text-format ApiServiceDescriptor messages.
    env.put("CONTROL_API_SERVICE_DESCRIPTOR", control.toString());
    env.put("LOGGING_API_SERVICE_DESCRIPTOR", logging.toString());
    env.put("PIPELINE_OPTIONS", options);
    env.put("RUNNER_CAPABILITIES", String.join(" ", capabilities));
    builder.inheritIO();
    return builder.start();
  }

  /**
   * One SDK worker: Beam's harness until its runner lets it go, then the JVM exits even if user
   * code left threads behind (KafkaIO's exactly-once sink keeps a non-daemon cache cleaner).
   */
  public static final class Worker {
    private Worker() {}

    public static void main(String[] args) {
      int status = 0;
      try {
        FnHarness.main(args);
      } catch (Throwable t) {
        t.printStackTrace();
        status = 1;
      }
      System.exit(status);
    }
  }
}
