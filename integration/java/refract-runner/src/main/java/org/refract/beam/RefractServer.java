package org.refract.beam;

import java.io.File;
import java.io.IOException;
import java.io.InputStream;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

/**
 * One {@code refract serve} per JVM, started by the first pipeline that needs it and reused by
 * the later ones (a test suite runs many), stopped when the JVM exits.
 *
 * <p>The binary is {@code --refractLocation}, else {@code refract} on {@code PATH}, else the copy
 * the {@code refract-beam} Python wheel installed, as that package finds it.
 */
final class RefractServer {
  private static final Duration START_TIMEOUT = Duration.ofSeconds(60);

  private static RefractServer running;
  private static final Map<String, String> LOCATED = new HashMap<>();

  private final Process process;
  private final String endpoint;
  private final String binary;

  private RefractServer(Process process, String endpoint, String binary) {
    this.process = process;
    this.endpoint = endpoint;
    this.binary = binary;
  }

  /** The job endpoint of this JVM's server, started now if there is none or it died. */
  static synchronized String endpoint(RefractPipelineOptions options) {
    // Located once per --refractLocation: the wheel's copy costs a Python start to find.
    String given = options.getRefractLocation() == null ? "" : options.getRefractLocation();
    String binary = LOCATED.computeIfAbsent(given, RefractServer::locate);
    if (running == null || !running.process.isAlive() || !running.binary.equals(binary)) {
      if (running != null) {
        running.process.destroy();
      }
      running = start(binary);
    }
    return running.endpoint;
  }

  private static RefractServer start(String binary) {
    int jobPort = freePort();
    int uiPort = freePort();
    List<String> command = new ArrayList<>();
    command.add(binary);
    command.add("serve");
    command.add("--job_port=" + jobPort);
    command.add("--ui_port=" + uiPort);
    Process process;
    Path log;
    try {
      // Readable by this user only (createTempFile's POSIX default).
      log = Files.createTempFile("refract-server-", ".log");
      process =
          new ProcessBuilder(command)
              .redirectErrorStream(true)
              .redirectOutput(ProcessBuilder.Redirect.appendTo(log.toFile()))
              .start();
    } catch (IOException e) {
      throw new IllegalStateException("cannot start " + String.join(" ", command), e);
    }
    Runtime.getRuntime().addShutdownHook(new Thread(process::destroy, "refract-server-stop"));
    awaitListening(process, jobPort, command, log);
    System.err.printf(
        "Refract is running pipelines of this JVM; its web UI is at http://127.0.0.1:%d/ "
            + "(log: %s)%n",
        uiPort, log);
    return new RefractServer(process, "127.0.0.1:" + jobPort, binary);
  }

  private static void awaitListening(
      Process process, int port, List<String> command, Path log) {
    Instant deadline = Instant.now().plus(START_TIMEOUT);
    while (Instant.now().isBefore(deadline)) {
      if (!process.isAlive()) {
        throw startFailed(command, "exited with status " + process.exitValue(), log);
      }
      try (Socket socket = new Socket()) {
        socket.connect(new InetSocketAddress("127.0.0.1", port), 200);
        return;
      } catch (IOException notYet) {
        sleep(50);
      }
    }
    process.destroy();
    throw startFailed(
        command, "did not listen within " + START_TIMEOUT.getSeconds() + " s", log);
  }

  private static IllegalStateException startFailed(List<String> command, String what, Path log) {
    return new IllegalStateException(String.join(" ", command) + " " + what + "; its log: " + log);
  }

  /** The binary to start (see the class comment); fails naming where it looked. */
  static String locate(String given) {
    if (given != null && !given.isEmpty()) {
      File file = new File(given);
      if (!file.isFile() || !file.canExecute()) {
        throw new IllegalArgumentException(
            "--refractLocation names " + given + ", which is not an executable file");
      }
      return file.getAbsolutePath();
    }
    String path = System.getenv("PATH");
    if (path != null) {
      for (String dir : path.split(File.pathSeparator)) {
        File candidate = new File(dir, "refract");
        if (candidate.isFile() && candidate.canExecute()) {
          return candidate.getAbsolutePath();
        }
      }
    }
    String python = System.getenv().getOrDefault("REFRACT_PYTHON", "python3");
    String fromWheel = wheelBinary(python);
    if (fromWheel != null) {
      return fromWheel;
    }
    throw new IllegalStateException(
        "cannot find the refract binary: pass --refractLocation, put refract on PATH, or "
            + "install the refract-beam wheel for "
            + python
            + " (set REFRACT_PYTHON to pick another interpreter)");
  }

  /** The refract-beam wheel's binary as {@code python} finds it, or null. */
  private static String wheelBinary(String python) {
    try {
      Process p =
          new ProcessBuilder(
                  python, "-c", "from refract_beam import _binary; print(_binary.find())")
              .redirectErrorStream(true)
              .start();
      String out;
      try (InputStream in = p.getInputStream()) {
        out = new String(in.readAllBytes(), StandardCharsets.UTF_8).trim();
      }
      if (!p.waitFor(30, TimeUnit.SECONDS) || p.exitValue() != 0) {
        return null;
      }
      File file = new File(out);
      return file.isFile() && file.canExecute() ? file.getAbsolutePath() : null;
    } catch (IOException e) {
      return null;
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return null;
    }
  }

  private static int freePort() {
    try (ServerSocket socket = new ServerSocket(0)) {
      return socket.getLocalPort();
    } catch (IOException e) {
      throw new IllegalStateException("no free port for refract", e);
    }
  }

  private static void sleep(long millis) {
    try {
      Thread.sleep(millis);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new IllegalStateException("interrupted while refract started", e);
    }
  }
}
