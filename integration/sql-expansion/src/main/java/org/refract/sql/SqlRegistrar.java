package org.refract.sql;

import java.util.Collections;
import java.util.Map;
import org.apache.beam.sdk.expansion.ExternalTransformRegistrar;
import org.apache.beam.sdk.extensions.sql.SqlTransform;
import org.apache.beam.sdk.transforms.ExternalTransformBuilder;
import org.apache.beam.sdk.transforms.PTransform;
import org.apache.beam.sdk.values.PCollection;
import org.apache.beam.sdk.values.PInput;
import org.apache.beam.sdk.values.Row;
import org.checkerframework.checker.nullness.qual.Nullable;

/**
 * Offers Beam SQL to other SDKs through the expansion service: Python's {@code SqlTransform}
 * asks for {@link #URN} with a query, an optional dialect and optional DDL, and gets a
 * {@link SqlTransform} over its input PCollection (named {@code PCOLLECTION} in the query).
 */
public final class SqlRegistrar implements ExternalTransformRegistrar {
  /** The URN Python's {@code apache_beam.transforms.sql.SqlTransform} expands. */
  public static final String URN = "beam:external:java:sql:v1";

  @Override
  public Map<String, ExternalTransformBuilder<?, ?, ?>> knownBuilderInstances() {
    return Collections.singletonMap(URN, new Builder());
  }

  /** What the caller sends; the expansion service fills it through the setters. */
  public static final class Configuration {
    private String query = "";
    private @Nullable String dialect;
    private @Nullable String ddl;

    public void setQuery(String query) {
      this.query = query;
    }

    public void setDialect(@Nullable String dialect) {
      this.dialect = dialect;
    }

    public void setDdl(@Nullable String ddl) {
      this.ddl = ddl;
    }
  }

  /** Builds the SqlTransform a configuration describes. */
  static final class Builder
      implements ExternalTransformBuilder<Configuration, PInput, PCollection<Row>> {
    @Override
    public PTransform<PInput, PCollection<Row>> buildExternal(Configuration configuration) {
      String dialect = configuration.dialect;
      if (dialect != null && !dialect.isEmpty() && !dialect.equalsIgnoreCase("calcite")) {
        throw new IllegalArgumentException(
            "SQL dialect '" + dialect + "' is not available here; only Calcite's is");
      }
      SqlTransform transform = SqlTransform.query(configuration.query);
      String ddl = configuration.ddl;
      if (ddl != null && !ddl.isEmpty()) {
        transform = transform.withDdlString(ddl);
      }
      return transform;
    }
  }
}
