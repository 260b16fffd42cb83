package org.refract.examples;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.util.Map;
import org.apache.beam.runners.portability.PortableRunner;
import org.apache.beam.sdk.Pipeline;
import org.apache.beam.sdk.coders.Coder;
import org.apache.beam.sdk.coders.VarLongCoder;
import org.apache.beam.sdk.io.range.OffsetRange;
import org.apache.beam.sdk.metrics.Counter;
import org.apache.beam.sdk.metrics.Metrics;
import org.apache.beam.sdk.options.Default;
import org.apache.beam.sdk.options.Description;
import org.apache.beam.sdk.options.PipelineOptionsFactory;
import org.apache.beam.sdk.options.StreamingOptions;
import org.apache.beam.sdk.options.Validation;
import org.apache.beam.sdk.state.BagState;
import org.apache.beam.sdk.state.StateSpec;
import org.apache.beam.sdk.state.StateSpecs;
import org.apache.beam.sdk.state.TimeDomain;
import org.apache.beam.sdk.state.Timer;
import org.apache.beam.sdk.state.TimerSpec;
import org.apache.beam.sdk.state.TimerSpecs;
import org.apache.beam.sdk.state.ValueState;
import org.apache.beam.sdk.transforms.Create;
import org.apache.beam.sdk.transforms.DoFn;
import org.apache.beam.sdk.transforms.ParDo;
import org.apache.beam.sdk.transforms.Reshuffle;
import org.apache.beam.sdk.transforms.splittabledofn.ManualWatermarkEstimator;
import org.apache.beam.sdk.transforms.splittabledofn.RestrictionTracker;
import org.apache.beam.sdk.transforms.splittabledofn.WatermarkEstimators;
import org.apache.beam.sdk.transforms.windowing.BoundedWindow;
import org.apache.beam.sdk.transforms.windowing.FixedWindows;
import org.apache.beam.sdk.transforms.windowing.IntervalWindow;
import org.apache.beam.sdk.transforms.windowing.Window;
import org.apache.beam.sdk.values.KV;
import org.apache.beam.sdk.values.PCollection;
import org.joda.time.Duration;
import org.joda.time.Instant;

/**
 * A streaming job that is updated while it runs: Refract's test of {@code --update} from Java
 * ({@code integration/python/test_java_update.py}).
 *
 * <p>A splittable source emits the numbers {@code 0..events-1}, a few per step before it resumes
 * itself (event time 100 ms per number), keyed by {@code n % 3} into fixed one-second windows. A
 * stateful DoFn drops duplicate numbers, counts and sums the rest in state, counts distinct
 * numbers in the counter {@code recovery/distinct_events}, and emits its totals from an
 * event-time timer at the end of each window. A sink writes one file per window and key,
 * {@code START_SECONDS-KEY.json}: writing it again writes the same file.
 *
 * <p>With {@code --changed}, the next version of the pipeline: a step added before the stateful
 * DoFn, a Reshuffle before the sink (which fuses the sink into a stage of its own), another sink
 * class writing the same files, and the stateful DoFn applied under {@code --statefulName}. With
 * {@code --update} and the {@code --jobName} of the running job it replaces that job; a renamed
 * stateful DoFn needs {@code --transformNameMapping={"DedupCount":"Counted"}}, which maps the
 * composite and every transform nested in it, as Dataflow's mapping does.
 *
 * <p>The client exits once the job is submitted (it prints "submitted"): submit it with an
 * EXTERNAL environment, whose workers outlive it.
 */
public final class UpdateCounts {
  private UpdateCounts() {}

  static final long MS_PER_EVENT = 100;
  static final long PER_STEP = 7;

  /** The options of this pipeline, {@code update} and its mapping as Dataflow's options name them. */
  public interface Options extends StreamingOptions {
    @Description("Directory the per-window results are written to")
    @Validation.Required
    String getOutput();

    void setOutput(String value);

    @Description("How many numbers the source emits")
    @Default.Long(400)
    long getEvents();

    void setEvents(long value);

    @Description("Run the next version of the pipeline")
    @Default.Boolean(false)
    boolean isChanged();

    void setChanged(boolean value);

    @Description("The name the stateful DoFn is applied under")
    @Default.String("DedupCount")
    String getStatefulName();

    void setStatefulName(String value);

    @Description("Replace the running job of --jobName with this pipeline, carrying its state")
    @Default.Boolean(false)
    boolean isUpdate();

    void setUpdate(boolean value);

    @Description("With --update: old transform name (prefix) -> new one, \"\" to drop it")
    Map<String, String> getTransformNameMapping();

    void setTransformNameMapping(Map<String, String> value);
  }

  /** Emits 0..n-1, {@link #PER_STEP} numbers per step, then resumes itself after 100 ms. */
  @DoFn.UnboundedPerElement
  static final class NumberedEvents extends DoFn<Long, Long> {
    @GetInitialRestriction
    public OffsetRange initialRestriction(@Element Long n) {
      return new OffsetRange(0, n);
    }

    @GetRestrictionCoder
    public Coder<OffsetRange> restrictionCoder() {
      return OffsetRange.Coder.of();
    }

    @GetInitialWatermarkEstimatorState
    public Instant initialWatermark() {
      return BoundedWindow.TIMESTAMP_MIN_VALUE;
    }

    @NewWatermarkEstimator
    public WatermarkEstimators.Manual newWatermarkEstimator(
        @WatermarkEstimatorState Instant state) {
      return new WatermarkEstimators.Manual(state);
    }

    @ProcessElement
    public ProcessContinuation process(
        RestrictionTracker<OffsetRange, Long> tracker,
        ManualWatermarkEstimator<Instant> estimator,
        OutputReceiver<Long> out) {
      long position = tracker.currentRestriction().getFrom();
      long end = Math.min(position + PER_STEP, tracker.currentRestriction().getTo());
      for (; position < end; position++) {
        if (!tracker.tryClaim(position)) {
          return ProcessContinuation.stop();
        }
        Instant at = new Instant(position * MS_PER_EVENT);
        out.outputWithTimestamp(position, at);
        estimator.setWatermark(at);
      }
      if (position < tracker.currentRestriction().getTo()) {
        return ProcessContinuation.resume().withResumeDelay(Duration.millis(100));
      }
      return ProcessContinuation.stop();
    }
  }

  /** {@code n -> (n % 3, n)}. */
  static final class KeyByRemainder extends DoFn<Long, KV<Long, Long>> {
    @ProcessElement
    public void process(@Element Long n, OutputReceiver<KV<Long, Long>> out) {
      out.output(KV.of(n % 3, n));
    }
  }

  /** The next version's added step: passes each element on. */
  static final class Stamp extends DoFn<KV<Long, Long>, KV<Long, Long>> {
    @ProcessElement
    public void process(@Element KV<Long, Long> kv, OutputReceiver<KV<Long, Long>> out) {
      out.output(kv);
    }
  }

  /**
   * Per key and window: distinct numbers, their count and sum in state; at the end of the window,
   * {@code (START_SECONDS-KEY, {"count": C, "total": T})}.
   */
  static final class DedupCount extends DoFn<KV<Long, Long>, KV<String, String>> {
    private final Counter distinct = Metrics.counter("recovery", "distinct_events");

    @StateId("seen")
    private final StateSpec<BagState<Long>> seenSpec = StateSpecs.bag(VarLongCoder.of());

    @StateId("count")
    private final StateSpec<ValueState<Long>> countSpec = StateSpecs.value(VarLongCoder.of());

    @StateId("total")
    private final StateSpec<ValueState<Long>> totalSpec = StateSpecs.value(VarLongCoder.of());

    @TimerId("end")
    private final TimerSpec endSpec = TimerSpecs.timer(TimeDomain.EVENT_TIME);

    @ProcessElement
    public void process(
        @Element KV<Long, Long> kv,
        BoundedWindow window,
        @StateId("seen") BagState<Long> seen,
        @StateId("count") ValueState<Long> count,
        @StateId("total") ValueState<Long> total,
        @TimerId("end") Timer end) {
      long number = kv.getValue();
      for (Long earlier : seen.read()) {
        if (earlier == number) {
          return;
        }
      }
      seen.add(number);
      distinct.inc();
      count.write(orZero(count.read()) + 1);
      total.write(orZero(total.read()) + number);
      end.set(window.maxTimestamp());
    }

    @OnTimer("end")
    public void emit(
        @Key Long key,
        BoundedWindow window,
        @StateId("count") ValueState<Long> count,
        @StateId("total") ValueState<Long> total,
        OutputReceiver<KV<String, String>> out) {
      long start = ((IntervalWindow) window).start().getMillis() / 1000;
      out.output(
          KV.of(
              start + "-" + key,
              "{\"count\": " + orZero(count.read()) + ", \"total\": " + orZero(total.read()) + "}"));
    }

    private static long orZero(Long value) {
      return value == null ? 0 : value;
    }
  }

  /** Writes {@code DIR/NAME.json} whole (a rename), so a reader never sees half of it. */
  static void writeWhole(String dir, String name, String content) throws IOException {
    Path target = Paths.get(dir, name + ".json");
    Path partial = Paths.get(dir, "." + name + ".json.partial");
    Files.write(partial, content.getBytes(StandardCharsets.UTF_8));
    Files.move(partial, target, StandardCopyOption.ATOMIC_MOVE, StandardCopyOption.REPLACE_EXISTING);
  }

  /** A sink writing each result to its file, as {@link #render} has it. */
  abstract static class ResultSink extends DoFn<KV<String, String>, Void> {
    private final String dir;

    ResultSink(String dir) {
      this.dir = dir;
    }

    abstract String render(String result);

    @ProcessElement
    public void process(@Element KV<String, String> result) throws IOException {
      writeWhole(dir, result.getKey(), render(result.getValue()));
    }
  }

  /** The first version's sink: the result as it is. */
  static final class WriteResults extends ResultSink {
    WriteResults(String dir) {
      super(dir);
    }

    @Override
    String render(String result) {
      return result;
    }
  }

  /** The next version's sink: the same JSON, one line ended. */
  static final class WriteResultsAgain extends ResultSink {
    WriteResultsAgain(String dir) {
      super(dir);
    }

    @Override
    String render(String result) {
      return result + "\n";
    }
  }

  public static void main(String[] args) {
    Options options = PipelineOptionsFactory.fromArgs(args).withValidation().as(Options.class);
    options.setStreaming(true);
    Pipeline p = Pipeline.create(options);
    PCollection<KV<Long, Long>> keyed =
        p.apply("Start", Create.of(options.getEvents()))
            .apply("Events", ParDo.of(new NumberedEvents()))
            .apply("KeyByRemainder", ParDo.of(new KeyByRemainder()))
            .apply(
                "Window", Window.<KV<Long, Long>>into(FixedWindows.of(Duration.standardSeconds(1))));
    if (options.isChanged()) {
      keyed = keyed.apply("Stamp", ParDo.of(new Stamp()));
    }
    PCollection<KV<String, String>> results =
        keyed.apply(options.getStatefulName(), ParDo.of(new DedupCount()));
    if (options.isChanged()) {
      results
          .apply("Regroup", Reshuffle.viaRandomKey())
          .apply("WriteAgain", ParDo.of(new WriteResultsAgain(options.getOutput())));
    } else {
      results.apply("Write", ParDo.of(new WriteResults(options.getOutput())));
    }
    // A streaming job runs until it is cancelled or replaced: submit it and leave.
    PortableRunner.fromOptions(options).run(p);
    System.out.println("submitted");
    System.exit(0);
  }
}
