package org.refract.bench;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.List;
import org.apache.beam.sdk.testing.PAssert;
import org.apache.beam.sdk.testing.TestPipeline;
import org.apache.beam.sdk.transforms.Combine;
import org.apache.beam.sdk.transforms.Create;
import org.apache.beam.sdk.transforms.DoFn;
import org.apache.beam.sdk.transforms.Flatten;
import org.apache.beam.sdk.transforms.GroupByKey;
import org.apache.beam.sdk.transforms.MapElements;
import org.apache.beam.sdk.transforms.ParDo;
import org.apache.beam.sdk.transforms.Sum;
import org.apache.beam.sdk.transforms.View;
import org.apache.beam.sdk.transforms.windowing.FixedWindows;
import org.apache.beam.sdk.transforms.windowing.Window;
import org.apache.beam.sdk.values.KV;
import org.apache.beam.sdk.values.PCollection;
import org.apache.beam.sdk.values.PCollectionList;
import org.apache.beam.sdk.values.PCollectionTuple;
import org.apache.beam.sdk.values.PCollectionView;
import org.apache.beam.sdk.values.TimestampedValue;
import org.apache.beam.sdk.values.TupleTag;
import org.apache.beam.sdk.values.TupleTagList;
import org.apache.beam.sdk.values.TypeDescriptors;
import org.joda.time.Duration;
import org.joda.time.Instant;
import org.junit.Rule;
import org.junit.Test;
import org.junit.runner.RunWith;
import org.junit.runners.Parameterized;

/**
 * Small TestPipelines as a user's JUnit suite has them (Map, GroupByKey, Combine.perKey, a side
 * input, Flatten, tagged outputs, windowed sums; each checked with PAssert), each run {@code
 * repeat} times: the runner comes from {@code -DbeamTestPipelineOptions}, so the same suite
 * measures each runner's cost per test (integration/bench/junit_suite.sh).
 */
@RunWith(Parameterized.class)
public class SmallPipelinesTest {
  @Rule public final transient TestPipeline p = TestPipeline.create();

  /** Each test runs this many times (system property {@code benchRepeat}, default 5). */
  @Parameterized.Parameters(name = "{0}")
  public static Collection<Object[]> repeats() {
    int n = Integer.getInteger("benchRepeat", 5);
    List<Object[]> out = new ArrayList<>();
    for (int i = 0; i < n; i++) {
      out.add(new Object[] {i});
    }
    return out;
  }

  public SmallPipelinesTest(int repeat) {}

  @Test
  public void map() {
    PCollection<Integer> doubled =
        p.apply(Create.of(1, 2, 3))
            .apply(MapElements.into(TypeDescriptors.integers()).via((Integer x) -> 2 * x));
    PAssert.that(doubled).containsInAnyOrder(2, 4, 6);
    p.run();
  }

  @Test
  public void groupByKey() {
    PCollection<KV<String, Iterable<Integer>>> grouped =
        p.apply(Create.of(KV.of("a", 1), KV.of("b", 2), KV.of("a", 3)))
            .apply(GroupByKey.create());
    PAssert.that(grouped)
        .satisfies(
            groups -> {
              int total = 0;
              for (KV<String, Iterable<Integer>> kv : groups) {
                for (int v : kv.getValue()) {
                  total += v;
                }
              }
              if (total != 6) {
                throw new AssertionError("sum " + total);
              }
              return null;
            });
    p.run();
  }

  @Test
  public void combinePerKey() {
    PCollection<KV<String, Integer>> sums =
        p.apply(Create.of(KV.of("a", 1), KV.of("b", 2), KV.of("a", 3)))
            .apply(Sum.integersPerKey());
    PAssert.that(sums).containsInAnyOrder(KV.of("a", 4), KV.of("b", 2));
    p.run();
  }

  /** Adds a singleton side input to each element. */
  static class AddSide extends DoFn<Integer, Integer> {
    private final PCollectionView<Integer> side;

    AddSide(PCollectionView<Integer> side) {
      this.side = side;
    }

    @ProcessElement
    public void process(ProcessContext c) {
      c.output(c.element() + c.sideInput(side));
    }
  }

  @Test
  public void sideInput() {
    PCollectionView<Integer> side = p.apply("Side", Create.of(10)).apply(View.asSingleton());
    PCollection<Integer> out =
        p.apply("Main", Create.of(1, 2)).apply(ParDo.of(new AddSide(side)).withSideInputs(side));
    PAssert.that(out).containsInAnyOrder(11, 12);
    p.run();
  }

  @Test
  public void flatten() {
    PCollection<Integer> a = p.apply("A", Create.of(1, 2));
    PCollection<Integer> b = p.apply("B", Create.of(3));
    PAssert.that(PCollectionList.of(a).and(b).apply(Flatten.pCollections()))
        .containsInAnyOrder(1, 2, 3);
    p.run();
  }

  static final TupleTag<Integer> EVEN = new TupleTag<Integer>() {};
  static final TupleTag<Integer> ODD = new TupleTag<Integer>() {};

  /** Sends even numbers to {@link #EVEN}, odd ones to {@link #ODD}. */
  static class SplitByParity extends DoFn<Integer, Integer> {
    @ProcessElement
    public void process(@Element Integer x, MultiOutputReceiver out) {
      out.get(x % 2 == 0 ? EVEN : ODD).output(x);
    }
  }

  @Test
  public void taggedOutputs() {
    PCollectionTuple outs =
        p.apply(Create.of(1, 2, 3, 4))
            .apply(ParDo.of(new SplitByParity()).withOutputTags(EVEN, TupleTagList.of(ODD)));
    PAssert.that(outs.get(EVEN)).containsInAnyOrder(2, 4);
    PAssert.that(outs.get(ODD)).containsInAnyOrder(1, 3);
    p.run();
  }

  @Test
  public void windowedSums() {
    PCollection<Integer> sums =
        p.apply(
                Create.timestamped(
                    Arrays.asList(
                        TimestampedValue.of(1, new Instant(1)),
                        TimestampedValue.of(2, new Instant(2)),
                        TimestampedValue.of(11, new Instant(11)))))
            .apply(Window.into(FixedWindows.of(Duration.millis(10))))
            .apply(Combine.globally(Sum.ofIntegers()).withoutDefaults());
    PAssert.that(sums).containsInAnyOrder(3, 11);
    p.run();
  }
}
