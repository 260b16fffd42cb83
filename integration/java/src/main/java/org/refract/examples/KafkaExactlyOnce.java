package org.refract.examples;

import java.util.Map;
import java.util.Optional;
import org.apache.beam.runners.portability.PortableRunner;
import org.apache.beam.sdk.Pipeline;
import org.apache.beam.sdk.coders.Coder;
import org.apache.beam.sdk.coders.CoderRegistry;
import org.apache.beam.sdk.coders.KvCoder;
import org.apache.beam.sdk.coders.VarLongCoder;
import org.apache.beam.sdk.io.kafka.KafkaIO;
import org.apache.beam.sdk.io.kafka.KafkaRecord;
import org.apache.beam.sdk.io.kafka.TimestampPolicy;
import org.apache.beam.sdk.io.kafka.TimestampPolicyFactory;
import org.apache.beam.sdk.options.Default;
import org.apache.beam.sdk.options.Description;
import org.apache.beam.sdk.options.PipelineOptionsFactory;
import org.apache.beam.sdk.options.StreamingOptions;
import org.apache.beam.sdk.options.Validation;
import org.apache.beam.sdk.transforms.Combine;
import org.apache.beam.sdk.transforms.DoFn;
import org.apache.beam.sdk.transforms.ParDo;
import org.apache.beam.sdk.transforms.windowing.BoundedWindow;
import org.apache.beam.sdk.transforms.windowing.FixedWindows;
import org.apache.beam.sdk.transforms.windowing.IntervalWindow;
import org.apache.beam.sdk.transforms.windowing.Window;
import org.apache.beam.sdk.values.KV;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.joda.time.Duration;
import org.joda.time.Instant;

/**
 * Kafka to Kafka, exactly once: Refract's test that its checkpoints and KafkaIO's sink
 * transactions are committed together.
 *
 * <p>Reads {@code key -> number} string records from {@code --inputTopic} (read_committed, offsets
 * committed to {@code --inputGroup} only when the runner finalizes a bundle, that is after a
 * checkpoint holds what the bundle read), counts and sums the numbers per key in fixed event-time
 * windows of {@code --windowMillis}, and writes one record per window and key to {@code
 * --outputTopic} with KafkaIO's exactly-once sink ({@code withEOS}), whose writer is a
 * {@code @RequiresStableInput} DoFn.
 *
 * <p>An element's event time is its Kafka record's create time, which the test's producer sets
 * explicitly. The watermark is the largest create time read so far, never the wall clock (an idle
 * partition does not move it), so the output depends only on the records produced: the producer
 * writes each partition in timestamp order (nothing is late) and ends with records far ahead in
 * event time that close every window before them.
 *
 * <p>Output record: key {@code KEY}, value {@code KEY@WINDOW_START_MILLIS count=C sum=S}.
 *
 * <p>Streaming; the client exits once the job is submitted (it prints "submitted"). Submit it
 * with an EXTERNAL environment so its workers outlive a runner that is killed.
 */
public final class KafkaExactlyOnce {
  private KafkaExactlyOnce() {}

  /** The options this pipeline adds to Beam's own. */
  public interface Options extends StreamingOptions {
    @Description("Kafka bootstrap servers, host:port[,...]")
    @Validation.Required
    String getBootstrapServers();

    void setBootstrapServers(String value);

    @Description("Topic to read: key -> decimal number, create time = event time")
    @Validation.Required
    String getInputTopic();

    void setInputTopic(String value);

    @Description("Topic the per-window results are written to, in transactions")
    @Validation.Required
    String getOutputTopic();

    void setOutputTopic(String value);

    @Description("Consumer group the input offsets are committed to (at bundle finalization)")
    @Default.String("refract-eos-input")
    String getInputGroup();

    void setInputGroup(String value);

    @Description("Group id KafkaIO's exactly-once sink keeps its shards' sequence ids under")
    @Default.String("refract-eos-group")
    String getSinkGroup();

    void setSinkGroup(String value);

    @Description("Shards (transactional producers) of the exactly-once sink")
    @Default.Integer(1)
    int getSinkShards();

    void setSinkShards(int value);

    @Description("Length of the fixed event-time windows, in milliseconds")
    @Default.Long(1000)
    long getWindowMillis();

    void setWindowMillis(long value);
  }

  /**
   * Event time = the record's create time; watermark = the largest create time read from the
   * partition (or the checkpointed watermark, after a restart). Unlike {@code withCreateTime}, an
   * idle partition never advances it to the wall clock, which would make records produced later
   * (with timestamps of the test's choosing) late.
   */
  static final class CreateTimeWatermark extends TimestampPolicy<String, String> {
    private Instant maxSeen;

    CreateTimeWatermark(Optional<Instant> previousWatermark) {
      maxSeen = previousWatermark.orElse(BoundedWindow.TIMESTAMP_MIN_VALUE);
    }

    @Override
    public Instant getTimestampForRecord(PartitionContext ctx, KafkaRecord<String, String> record) {
      Instant ts = new Instant(record.getTimestamp());
      if (ts.isAfter(maxSeen)) {
        maxSeen = ts;
      }
      return ts;
    }

    @Override
    public Instant getWatermark(PartitionContext ctx) {
      return maxSeen;
    }
  }

  static final class CreateTimeWatermarkFactory
      implements TimestampPolicyFactory<String, String> {
    @Override
    public TimestampPolicy<String, String> createTimestampPolicy(
        TopicPartition tp, Optional<Instant> previousWatermark) {
      return new CreateTimeWatermark(previousWatermark);
    }
  }

  /** Count and sum of a key's numbers in a window: accumulator KV(count, sum). */
  static final class CountAndSum extends Combine.CombineFn<Long, KV<Long, Long>, KV<Long, Long>> {
    @Override
    public KV<Long, Long> createAccumulator() {
      return KV.of(0L, 0L);
    }

    @Override
    public KV<Long, Long> addInput(KV<Long, Long> acc, Long input) {
      return KV.of(acc.getKey() + 1, acc.getValue() + input);
    }

    @Override
    public KV<Long, Long> mergeAccumulators(Iterable<KV<Long, Long>> accs) {
      long count = 0;
      long sum = 0;
      for (KV<Long, Long> acc : accs) {
        count += acc.getKey();
        sum += acc.getValue();
      }
      return KV.of(count, sum);
    }

    @Override
    public KV<Long, Long> extractOutput(KV<Long, Long> acc) {
      return acc;
    }

    @Override
    public Coder<KV<Long, Long>> getAccumulatorCoder(CoderRegistry registry, Coder<Long> input) {
      return KvCoder.of(VarLongCoder.of(), VarLongCoder.of());
    }

    @Override
    public Coder<KV<Long, Long>> getDefaultOutputCoder(CoderRegistry registry, Coder<Long> input) {
      return KvCoder.of(VarLongCoder.of(), VarLongCoder.of());
    }
  }

  /** {@code key -> "123"} to {@code key -> 123}. */
  static final class ParseNumber extends DoFn<KV<String, String>, KV<String, Long>> {
    @ProcessElement
    public void processElement(
        @Element KV<String, String> record, OutputReceiver<KV<String, Long>> out) {
      out.output(KV.of(record.getKey(), Long.parseLong(record.getValue().trim())));
    }
  }

  /** One output record per window and key. */
  static final class Format extends DoFn<KV<String, KV<Long, Long>>, KV<String, String>> {
    @ProcessElement
    public void processElement(
        @Element KV<String, KV<Long, Long>> result,
        BoundedWindow window,
        OutputReceiver<KV<String, String>> out) {
      long start = ((IntervalWindow) window).start().getMillis();
      String key = result.getKey();
      out.output(
          KV.of(
              key,
              String.format(
                  "%s@%d count=%d sum=%d",
                  key, start, result.getValue().getKey(), result.getValue().getValue())));
    }
  }

  public static void main(String[] args) {
    Options options = PipelineOptionsFactory.fromArgs(args).withValidation().as(Options.class);
    options.setStreaming(true);
    Pipeline p = Pipeline.create(options);
    Map<String, Object> consumerConfig =
        Map.of(
            ConsumerConfig.GROUP_ID_CONFIG, options.getInputGroup(),
            ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest",
            ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
    p.apply(
            "Read",
            KafkaIO.<String, String>read()
                .withBootstrapServers(options.getBootstrapServers())
                .withTopic(options.getInputTopic())
                .withKeyDeserializer(StringDeserializer.class)
                .withValueDeserializer(StringDeserializer.class)
                .withConsumerConfigUpdates(consumerConfig)
                .withReadCommitted()
                .commitOffsetsInFinalize()
                .withTimestampPolicyFactory(new CreateTimeWatermarkFactory())
                .withoutMetadata())
        .apply("ParseNumber", ParDo.of(new ParseNumber()))
        .apply(
            "Window",
            Window.<KV<String, Long>>into(
                FixedWindows.of(Duration.millis(options.getWindowMillis()))))
        .apply("CountAndSum", Combine.perKey(new CountAndSum()))
        .apply("Format", ParDo.of(new Format()))
        .apply(
            "Write",
            KafkaIO.<String, String>write()
                .withBootstrapServers(options.getBootstrapServers())
                .withTopic(options.getOutputTopic())
                .withKeySerializer(StringSerializer.class)
                .withValueSerializer(StringSerializer.class)
                .withEOS(options.getSinkShards(), options.getSinkGroup()));
    // A streaming job runs until it is cancelled: submit it and leave. The job id is the server's
    // business (`refract jobs` lists it); the workers are the environment's, not this JVM's.
    //
    // Submitted through the runner itself rather than p.run(): Pipeline.run() first validates
    // every transform, and KafkaIO's exactly-once sink refuses any runner whose class is not on
    // its list (DirectRunner, Dataflow, Flink, Spark), PortableRunner included, whatever the job
    // service behind it guarantees. Refract gives the sink what that list stands for: its
    // writer (@RequiresStableInput) sees only input a checkpoint holds, the same input again
    // after a restart.
    PortableRunner.fromOptions(options).run(p);
    System.out.println("submitted");
    System.exit(0);
  }
}
