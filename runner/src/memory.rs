//! `--memory_budget`: how much memory a job's waiting elements may take.
//!
//! The engine bounds each stage's queue of waiting elements
//! (`EngineConfig::max_pending_bytes`): a stage whose consumer is over its
//! bound gets no new bundles, so a fast source or a slow sink cannot fill
//! memory. The budget is split evenly over the job's stages, so a job's
//! queues together stay near it (a bundle already running may overshoot
//! its consumer's share by what it outputs). A batch GroupByKey may hold one
//! share in memory and spills the rest (`refract_engine::spill`); a
//! splittable bundle is split once its output reaches a share.

use std::path::Path;

/// The smallest share a stage gets, whatever the budget: below this,
/// bundles would be too small to make progress efficiently.
const MIN_STAGE_BYTES: usize = 4 << 20;

/// Default budget when the machine's memory cannot be read.
const FALLBACK_BUDGET: usize = 1 << 30;

/// Parses a size: a number of bytes with an optional binary suffix
/// (`k`, `m`, `g`, `t`, optionally followed by `b` or `ib`, any case), as
/// in `--memory_budget 1g` or `512MiB`.
pub fn parse_byte_size(text: &str) -> Result<usize, String> {
    let trimmed = text.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (number, suffix) = trimmed.split_at(digits_end);
    let number: usize = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size (e.g. 512m, 2g, 1073741824)"))?;
    let unit: usize = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        other => {
            return Err(format!(
                "unknown size unit '{other}' in '{text}' (use k, m, g or t)"
            ))
        }
    };
    number
        .checked_mul(unit)
        .filter(|&bytes| bytes > 0)
        .ok_or_else(|| format!("'{text}' is not a usable size"))
}

/// The default budget: a quarter of the machine's memory (leaving the rest
/// to SDK workers, grouping buffers and everything else).
pub fn default_budget() -> usize {
    total_memory(Path::new("/proc/meminfo"))
        .map(|total| total / 4)
        .unwrap_or(FALLBACK_BUDGET)
}

/// `MemTotal` of a `/proc/meminfo`-style file, in bytes.
fn total_memory(meminfo: &Path) -> Option<usize> {
    let text = std::fs::read_to_string(meminfo).ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// What each of a job's `stages` stages may have waiting.
pub fn per_stage_bytes(budget: usize, stages: usize) -> usize {
    (budget / stages.max(1)).max(MIN_STAGE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_byte_size("1g"), Ok(1 << 30));
        assert_eq!(parse_byte_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_byte_size("64 m"), Ok(64 << 20));
        assert_eq!(parse_byte_size("1048576"), Ok(1 << 20));
        assert_eq!(parse_byte_size("2Tb"), Ok(2 << 40));
    }

    #[test]
    fn bad_sizes_say_why() {
        assert!(parse_byte_size("lots").unwrap_err().contains("not a size"));
        assert!(parse_byte_size("1x")
            .unwrap_err()
            .contains("unknown size unit 'x'"));
        assert!(parse_byte_size("0")
            .unwrap_err()
            .contains("not a usable size"));
        assert!(parse_byte_size("99999999999t").is_err());
    }

    #[test]
    fn the_budget_is_split_over_stages_with_a_floor() {
        assert_eq!(per_stage_bytes(1 << 30, 4), 256 << 20);
        assert_eq!(per_stage_bytes(1 << 30, 0), 1 << 30);
        assert_eq!(per_stage_bytes(16 << 20, 100), MIN_STAGE_BYTES);
    }

    #[test]
    fn total_memory_is_read_from_meminfo() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let path = dir.path().join("meminfo");
        std::fs::write(&path, "MemTotal:       24576000 kB\nMemFree: 1 kB\n").expect("written");
        assert_eq!(total_memory(&path), Some(24_576_000 * 1024));
        assert_eq!(total_memory(&dir.path().join("missing")), None);
        assert!(default_budget() > 0);
    }
}
