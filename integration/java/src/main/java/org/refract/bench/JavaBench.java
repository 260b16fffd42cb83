package org.refract.bench;

import org.apache.beam.sdk.Pipeline;
import org.apache.beam.sdk.coders.VarLongCoder;
import org.apache.beam.sdk.io.GenerateSequence;
import org.apache.beam.sdk.io.TextIO;
import org.apache.beam.sdk.options.Default;
import org.apache.beam.sdk.options.Description;
import org.apache.beam.sdk.options.PipelineOptions;
import org.apache.beam.sdk.options.PipelineOptionsFactory;
import org.apache.beam.sdk.options.Validation;
import org.apache.beam.sdk.state.StateSpec;
import org.apache.beam.sdk.state.StateSpecs;
import org.apache.beam.sdk.state.TimeDomain;
import org.apache.beam.sdk.state.Timer;
import org.apache.beam.sdk.state.TimerSpec;
import org.apache.beam.sdk.state.TimerSpecs;
import org.apache.beam.sdk.state.ValueState;
import org.apache.beam.sdk.transforms.DoFn;
import org.apache.beam.sdk.transforms.GroupByKey;
import org.apache.beam.sdk.transforms.MapElements;
import org.apache.beam.sdk.transforms.ParDo;
import org.apache.beam.sdk.transforms.Sum;
import org.apache.beam.sdk.transforms.WithTimestamps;
import org.apache.beam.sdk.transforms.windowing.BoundedWindow;
import org.apache.beam.sdk.transforms.windowing.FixedWindows;
import org.apache.beam.sdk.transforms.windowing.GlobalWindows;
import org.apache.beam.sdk.transforms.windowing.Window;
import org.apache.beam.sdk.values.KV;
import org.apache.beam.sdk.values.PCollection;
import org.apache.beam.sdk.values.TypeDescriptors;
import org.joda.time.Duration;
import org.joda.time.Instant;

/**
 * Java workloads for Refract's benchmarks ({@code integration/bench/java_bench.sh}), each ending
 * in one number written to {@code --output}: the sum of the records {@code 0..records-1}, which
 * every runner must get ({@code records * (records - 1) / 2}).
 *
 * <ul>
 *   <li>{@code gbk}: records keyed over {@code --keys} keys, grouped, each group summed;
 *   <li>{@code combine}: records stamped one per millisecond, in 1 s fixed windows, summed per key
 *       and window ({@code Sum.longsPerKey}, which the runner may lift);
 *   <li>{@code stateful}: a stateful DoFn sums each key's records in a value state and emits the
 *       sum from an event-time timer at the end of the window.
 * </ul>
 *
 * <p>Prints {@code BENCH_JOB_SECONDS s}: from {@code run()} until {@code waitUntilFinish()}
 * returns (submission and execution, not the JVM's start-up).
 */
public final class JavaBench {
  private JavaBench() {}

  /** The options this pipeline adds to Beam's own. */
  public interface Options extends PipelineOptions {
    @Description("gbk, combine or stateful")
    @Default.String("gbk")
    String getWorkload();

    void setWorkload(String value);

    @Description("Records 0..records-1")
    @Default.Long(2_000_000L)
    long getRecords();

    void setRecords(long value);

    @Description("Distinct keys")
    @Default.Long(100_000L)
    long getKeys();

    void setKeys(long value);

    @Description("Output file (one shard, exactly this name)")
    @Validation.Required
    String getOutput();

    void setOutput(String value);
  }

  /** Sums a group's values. */
  static final class SumGroup extends DoFn<KV<Long, Iterable<Long>>, Long> {
    @ProcessElement
    public void processElement(@Element KV<Long, Iterable<Long>> group, OutputReceiver<Long> out) {
      long sum = 0;
      for (long v : group.getValue()) {
        sum += v;
      }
      out.output(sum);
    }
  }

  /** Sums each key's values in state; emits the sum when the window closes. */
  static final class SumInState extends DoFn<KV<Long, Long>, Long> {
    @StateId("sum")
    private final StateSpec<ValueState<Long>> sumSpec = StateSpecs.value(VarLongCoder.of());

    @TimerId("flush")
    private final TimerSpec flushSpec = TimerSpecs.timer(TimeDomain.EVENT_TIME);

    @ProcessElement
    public void processElement(
        @Element KV<Long, Long> kv,
        BoundedWindow window,
        @StateId("sum") ValueState<Long> sum,
        @TimerId("flush") Timer flush) {
      Long before = sum.read();
      sum.write((before == null ? 0L : before) + kv.getValue());
      flush.set(window.maxTimestamp());
    }

    @OnTimer("flush")
    public void onFlush(@StateId("sum") ValueState<Long> sum, OutputReceiver<Long> out) {
      Long total = sum.read();
      if (total != null) {
        out.output(total);
      }
      sum.clear();
    }
  }

  public static void main(String[] args) {
    Options options = PipelineOptionsFactory.fromArgs(args).withValidation().as(Options.class);
    long keys = Math.max(1, options.getKeys());
    Pipeline p = Pipeline.create(options);
    PCollection<KV<Long, Long>> keyed =
        p.apply(GenerateSequence.from(0).to(options.getRecords()))
            .apply(
                "Key",
                MapElements.into(
                        TypeDescriptors.kvs(TypeDescriptors.longs(), TypeDescriptors.longs()))
                    .via((Long i) -> KV.of(i % keys, i)));
    PCollection<Long> sums;
    switch (options.getWorkload()) {
      case "gbk":
        sums = keyed.apply(GroupByKey.create()).apply("SumGroup", ParDo.of(new SumGroup()));
        break;
      case "combine":
        sums =
            keyed
                .apply(
                    "OnePerMillisecond",
                    WithTimestamps.of((KV<Long, Long> kv) -> new Instant(kv.getValue())))
                .apply("OneSecond", Window.into(FixedWindows.of(Duration.standardSeconds(1))))
                .apply("SumPerKey", Sum.longsPerKey())
                .apply("Values", MapElements.into(TypeDescriptors.longs()).via(KV::getValue))
                .apply("Global", Window.into(new GlobalWindows()));
        break;
      case "stateful":
        sums = keyed.apply("SumInState", ParDo.of(new SumInState()));
        break;
      default:
        throw new IllegalArgumentException(
            "unknown --workload=" + options.getWorkload() + " (gbk, combine or stateful)");
    }
    sums.apply("Total", Sum.longsGlobally())
        .apply("Format", MapElements.into(TypeDescriptors.strings()).via(String::valueOf))
        .apply(TextIO.write().to(options.getOutput()).withoutSharding());
    long start = System.nanoTime();
    p.run().waitUntilFinish();
    System.out.printf("BENCH_JOB_SECONDS %.6f%n", (System.nanoTime() - start) / 1e9);
  }
}
