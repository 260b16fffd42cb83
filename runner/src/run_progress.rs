//! What `refract run` shows of a running job: one line per SDK or
//! GroupByKey stage (what it runs, elements processed, output
//! watermark), redrawn in place on a terminal by `indicatif`, printed once
//! at the end otherwise.

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use refract_engine::manager::StageStats;
use refract_engine::time::{MAX_TIMESTAMP, MIN_TIMESTAMP};

/// The stages' lines on a terminal, each a line `indicatif` redraws in
/// place as the job goes on (and keeps where other output scrolls).
pub struct StageProgress {
    bars: MultiProgress,
    lines: Vec<ProgressBar>,
    /// A line shows its message and nothing else (parsed once, not at
    /// every refresh).
    style: ProgressStyle,
}

impl StageProgress {
    /// Lines drawn on standard error.
    pub fn on_stderr() -> StageProgress {
        StageProgress {
            bars: MultiProgress::with_draw_target(ProgressDrawTarget::stderr()),
            lines: Vec::new(),
            style: ProgressStyle::with_template("{msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner()),
        }
    }

    /// Shows `lines` in place of what was shown.
    pub fn show(&mut self, lines: &[String]) {
        while self.lines.len() < lines.len() {
            let line = self.bars.add(ProgressBar::no_length());
            line.set_style(self.style.clone());
            self.lines.push(line);
        }
        while self.lines.len() > lines.len() {
            if let Some(line) = self.lines.pop() {
                line.finish_and_clear();
                self.bars.remove(&line);
            }
        }
        for (bar, text) in self.lines.iter().zip(lines) {
            bar.set_message(text.clone());
        }
    }

    /// Shows `lines` for the last time and leaves them on the terminal.
    pub fn finish(mut self, lines: &[String]) {
        self.show(lines);
        for line in &self.lines {
            line.finish();
        }
    }
}

/// One line per stage: what it runs, elements processed, output watermark.
pub fn progress_lines(stages: &[StageStats]) -> Vec<String> {
    stages
        .iter()
        .enumerate()
        .filter(|(_, s)| s.kind == "sdk" || s.kind == "group_by_key")
        .map(|(i, s)| {
            let mut what = s.name.replace('+', " → ");
            if what.chars().count() > 60 {
                what = what.chars().take(59).collect::<String>() + "…";
            }
            format!(
                "  #{i:<3} {what:<60} {:>10} elements  watermark {}",
                s.elements_processed,
                format_watermark(s.output_watermark)
            )
        })
        .collect()
}

/// A watermark as UTC time, or `-inf`/`+inf` at the ends of time.
pub fn format_watermark(ms: i64) -> String {
    if ms <= MIN_TIMESTAMP {
        return "-inf".to_string();
    }
    if ms >= MAX_TIMESTAMP {
        return "+inf".to_string();
    }
    let (days, ms_of_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        ms_of_day / 3_600_000,
        ms_of_day / 60_000 % 60,
        ms_of_day / 1_000 % 60,
        ms_of_day % 1_000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watermarks_read_as_utc_times() {
        assert_eq!(format_watermark(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            format_watermark(1_796_000_461_123),
            "2026-11-30T01:01:01.123Z"
        );
        assert_eq!(format_watermark(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(format_watermark(MIN_TIMESTAMP), "-inf");
        assert_eq!(format_watermark(MAX_TIMESTAMP), "+inf");
    }

    #[test]
    fn progress_shows_sdk_and_grouping_stages() {
        let stage = |name: &str, kind: &'static str| StageStats {
            name: name.into(),
            kind,
            inputs: vec![],
            input_watermark: MIN_TIMESTAMP,
            output_watermark: MAX_TIMESTAMP,
            pending_elements: 0,
            pending_bytes: 0,
            bundles_in_flight: 0,
            bundles_committed: 1,
            elements_processed: 12,
            throttled_ms: 0,
            spilled_bytes: 0,
            ..StageStats::default()
        };
        let lines = progress_lines(&[
            stage("Impulse", "impulse"),
            stage("Read+Split", "sdk"),
            stage("Group", "group_by_key"),
        ]);
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].starts_with("  #1   Read → Split"), "{lines:?}");
        assert!(
            lines[0].ends_with("12 elements  watermark +inf"),
            "{lines:?}"
        );
    }
}
