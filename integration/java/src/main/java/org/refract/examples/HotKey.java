package org.refract.examples;

import java.util.Arrays;
import org.apache.beam.sdk.Pipeline;
import org.apache.beam.sdk.io.GenerateSequence;
import org.apache.beam.sdk.io.TextIO;
import org.apache.beam.sdk.options.Default;
import org.apache.beam.sdk.options.Description;
import org.apache.beam.sdk.options.PipelineOptions;
import org.apache.beam.sdk.options.PipelineOptionsFactory;
import org.apache.beam.sdk.options.Validation;
import org.apache.beam.sdk.transforms.DoFn;
import org.apache.beam.sdk.transforms.GroupByKey;
import org.apache.beam.sdk.transforms.ParDo;
import org.apache.beam.sdk.values.KV;

/**
 * Groups {@code --totalMb} MiB of 64 KiB values under one key and writes {@code key:count:bytes}.
 *
 * <p>Refract's test of a key larger than the runner's memory budget reaching the Java SDK: the
 * GroupByKey spills the key and hands it to the counting DoFn as a state-backed iterable, which
 * the Java harness pages through over the state API as the DoFn iterates it.
 */
public final class HotKey {
  private HotKey() {}

  /** Bytes of one value. */
  static final int VALUE_BYTES = 64 << 10;

  /** The options this pipeline adds to Beam's own. */
  public interface Options extends PipelineOptions {
    @Description("MiB of values under the one key")
    @Default.Integer(96)
    int getTotalMb();

    void setTotalMb(int value);

    @Description("Output file (one shard, exactly this name)")
    @Validation.Required
    String getOutput();

    void setOutput(String value);
  }

  /** Value {@code i}: 64 KiB, numbered in its first bytes. */
  static final class MakeValue extends DoFn<Long, KV<String, byte[]>> {
    @ProcessElement
    public void processElement(@Element Long i, OutputReceiver<KV<String, byte[]>> out) {
      byte[] value = new byte[VALUE_BYTES];
      Arrays.fill(value, (byte) (i % 251));
      value[0] = (byte) (i >>> 24);
      value[1] = (byte) (i >>> 16);
      value[2] = (byte) (i >>> 8);
      value[3] = (byte) (long) i;
      out.output(KV.of("hot", value));
    }
  }

  /** A key's count and bytes, iterating its values once. */
  static final class Summarize extends DoFn<KV<String, Iterable<byte[]>>, String> {
    @ProcessElement
    public void processElement(
        @Element KV<String, Iterable<byte[]>> group, OutputReceiver<String> out) {
      long count = 0;
      long bytes = 0;
      for (byte[] value : group.getValue()) {
        count++;
        bytes += value.length;
      }
      out.output(group.getKey() + ":" + count + ":" + bytes);
    }
  }

  public static void main(String[] args) {
    Options options = PipelineOptionsFactory.fromArgs(args).withValidation().as(Options.class);
    long values = options.getTotalMb() * (1L << 20) / VALUE_BYTES;
    Pipeline p = Pipeline.create(options);
    p.apply(GenerateSequence.from(0).to(values))
        .apply("MakeValue", ParDo.of(new MakeValue()))
        .apply(GroupByKey.create())
        .apply("Summarize", ParDo.of(new Summarize()))
        .apply(TextIO.write().to(options.getOutput()).withoutSharding());
    p.run().waitUntilFinish();
  }
}
