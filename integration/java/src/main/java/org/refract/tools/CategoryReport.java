package org.refract.tools;

import java.io.File;
import java.lang.annotation.Annotation;
import java.lang.reflect.Method;
import java.lang.reflect.Modifier;
import java.util.ArrayList;
import java.util.Enumeration;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.jar.JarEntry;
import java.util.jar.JarFile;
import javax.xml.parsers.DocumentBuilderFactory;
import org.w3c.dom.Document;
import org.w3c.dom.Element;
import org.w3c.dom.NodeList;

/**
 * Counts a ValidatesRunner run per JUnit category, so docs/compatibility.md can say which parts
 * of the Beam model pass: Surefire's reports say how each test ended but not its categories, and
 * the tests that an excluded category kept out of the run appear in no report at all.
 *
 * <p>Usage: {@code CategoryReport TEST_JAR REPORT_DIR EXCLUDED_CATEGORY,...}. The test jar and
 * its dependencies must be on the classpath. Prints a Markdown table: per category, the tests
 * that passed, failed (errors included), were skipped, were excluded (they carry an excluded
 * category), and were not run (selected, but filtered out by name, e.g. a test that cannot
 * finish); then the totals. A test counts under every category it carries.
 */
public final class CategoryReport {
  private static final String VALIDATES_RUNNER = "org.apache.beam.sdk.testing.ValidatesRunner";
  private static final String CATEGORY = "org.junit.experimental.categories.Category";
  private static final String TEST = "org.junit.Test";
  private static final String[] OUTCOMES = {"passed", "failed", "skipped", "excluded", "not run"};

  private CategoryReport() {}

  public static void main(String[] args) throws Exception {
    if (args.length != 3) {
      System.err.println("usage: CategoryReport TEST_JAR REPORT_DIR EXCLUDED_CATEGORY,...");
      System.exit(2);
    }
    Set<String> excluded = new LinkedHashSet<>(List.of(args[2].split(",")));
    Map<String, String> outcomes = readReports(new File(args[1]));
    Map<String, int[]> table = new TreeMap<>();
    int[] total = new int[OUTCOMES.length];
    for (Map.Entry<String, Set<String>> test : validatesRunnerTests(args[0]).entrySet()) {
      Set<String> categories = test.getValue();
      String outcome;
      if (categories.stream().anyMatch(c -> isExcluded(c, excluded))) {
        outcome = "excluded";
      } else {
        outcome = outcomes.getOrDefault(test.getKey(), "not run");
      }
      int column = List.of(OUTCOMES).indexOf(outcome);
      total[column]++;
      for (String category : categories) {
        if (!category.equals(VALIDATES_RUNNER)) {
          table.computeIfAbsent(shortName(category), k -> new int[OUTCOMES.length])[column]++;
        }
      }
    }
    System.out.println("| Category | Passed | Failed | Skipped | Excluded | Not run |");
    System.out.println("|---|---:|---:|---:|---:|---:|");
    for (Map.Entry<String, int[]> row : table.entrySet()) {
      System.out.println(line(row.getKey(), row.getValue()));
    }
    System.out.println(line("**All ValidatesRunner tests**", total));
  }

  /**
   * Whether {@code category} is excluded: named, or a subtype of an excluded category (JUnit
   * matches categories by assignability, e.g. UsesJavaExpansionService is a UsesExternalService).
   */
  private static boolean isExcluded(String category, Set<String> excluded) {
    ClassLoader loader = CategoryReport.class.getClassLoader();
    try {
      Class<?> c = Class.forName(category, false, loader);
      for (String e : excluded) {
        if (Class.forName(e, false, loader).isAssignableFrom(c)) {
          return true;
        }
      }
      return false;
    } catch (ClassNotFoundException e) {
      return excluded.contains(category);
    }
  }

  private static String line(String name, int[] counts) {
    StringBuilder out = new StringBuilder("| ").append(name);
    for (int count : counts) {
      out.append(" | ").append(count);
    }
    return out.append(" |").toString();
  }

  private static String shortName(String category) {
    return category.substring(category.lastIndexOf('.') + 1);
  }

  /** Outcome of every test case in Surefire's XML reports, by "class#method". */
  private static Map<String, String> readReports(File dir) throws Exception {
    Map<String, String> outcomes = new TreeMap<>();
    File[] reports = dir.listFiles((d, name) -> name.startsWith("TEST-") && name.endsWith(".xml"));
    if (reports == null) {
      return outcomes;
    }
    DocumentBuilderFactory factory = DocumentBuilderFactory.newInstance();
    for (File report : reports) {
      Document doc = factory.newDocumentBuilder().parse(report);
      NodeList cases = doc.getElementsByTagName("testcase");
      for (int i = 0; i < cases.getLength(); i++) {
        Element c = (Element) cases.item(i);
        String outcome = "passed";
        if (c.getElementsByTagName("failure").getLength() > 0
            || c.getElementsByTagName("error").getLength() > 0) {
          outcome = "failed";
        } else if (c.getElementsByTagName("skipped").getLength() > 0) {
          outcome = "skipped";
        }
        // Parameterized runs ("test[0]", "test[1]") count as one test: failed if any failed.
        String method = c.getAttribute("name").replaceAll("\\[.*\\]$", "");
        outcomes.merge(
            c.getAttribute("classname") + "#" + method,
            outcome,
            (a, b) -> List.of(a, b).contains("failed") ? "failed" : a.equals("passed") ? b : a);
      }
    }
    return outcomes;
  }

  /**
   * Every ValidatesRunner test method of the jar ("class#method"), with its categories: those of
   * the method, its class, the classes enclosing it, and their superclasses.
   */
  private static Map<String, Set<String>> validatesRunnerTests(String jarPath) throws Exception {
    Map<String, Set<String>> tests = new TreeMap<>();
    ClassLoader loader = CategoryReport.class.getClassLoader();
    try (JarFile jar = new JarFile(jarPath)) {
      Enumeration<JarEntry> entries = jar.entries();
      while (entries.hasMoreElements()) {
        String name = entries.nextElement().getName();
        if (!name.endsWith(".class")) {
          continue;
        }
        Class<?> cls;
        try {
          cls = Class.forName(name.replace('/', '.').replaceAll("\\.class$", ""), false, loader);
        } catch (Throwable unloadable) {
          continue;
        }
        if (Modifier.isAbstract(cls.getModifiers()) || cls.isInterface()) {
          continue;
        }
        Set<String> classCategories = classCategories(cls);
        Method[] methods;
        try {
          methods = cls.getMethods();
        } catch (Throwable unloadable) {
          continue;
        }
        for (Method method : methods) {
          if (annotation(method.getAnnotations(), TEST) == null) {
            continue;
          }
          Set<String> categories = new LinkedHashSet<>(classCategories);
          categories.addAll(categoriesOf(method.getAnnotations()));
          if (categories.contains(VALIDATES_RUNNER)) {
            tests.put(cls.getName() + "#" + method.getName(), categories);
          }
        }
      }
    }
    return tests;
  }

  private static Set<String> classCategories(Class<?> cls) {
    Set<String> out = new LinkedHashSet<>();
    for (Class<?> c = cls; c != null; c = c.getEnclosingClass()) {
      for (Class<?> s = c; s != null; s = s.getSuperclass()) {
        out.addAll(categoriesOf(s.getAnnotations()));
      }
    }
    return out;
  }

  private static Set<String> categoriesOf(Annotation[] annotations) {
    Set<String> out = new LinkedHashSet<>();
    Annotation category = annotation(annotations, CATEGORY);
    if (category == null) {
      return out;
    }
    try {
      Class<?>[] values = (Class<?>[]) category.annotationType().getMethod("value").invoke(category);
      for (Class<?> value : values) {
        out.add(value.getName());
      }
    } catch (ReflectiveOperationException e) {
      throw new IllegalStateException("cannot read @Category", e);
    }
    return out;
  }

  private static Annotation annotation(Annotation[] annotations, String type) {
    List<Annotation> found = new ArrayList<>();
    for (Annotation a : annotations) {
      if (a.annotationType().getName().equals(type)) {
        found.add(a);
      }
    }
    return found.isEmpty() ? null : found.get(0);
  }
}
