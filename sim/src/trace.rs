//! Request traces: the Azure LLM inference trace's CSV
//! (`TIMESTAMP,ContextTokens,GeneratedTokens`, one row per request) read
//! into arrival offsets and token counts. Every problem names the file,
//! line and column.

use std::path::{Path, PathBuf};

/// One request of a trace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TraceRow {
    /// Seconds since the trace's first request.
    pub at: f64,
    /// Prompt (context) tokens.
    pub prompt: u32,
    /// Generated tokens.
    pub output: u32,
}

/// A loaded trace, rows in time order.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Where it was read from.
    pub file: PathBuf,
    /// The requests.
    pub rows: Vec<TraceRow>,
}

/// Why a trace could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}:{line}:{column}: {message}", file.display())]
pub struct TraceError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

/// The largest trace file read: 1 GiB (the Azure conversation trace is
/// 0.7 MB; its week-long siblings are tens of MB).
pub const MAX_TRACE_BYTES: u64 = 1 << 30;

impl Trace {
    /// Reads a trace file.
    pub fn read(file: &Path) -> Result<Trace, TraceError> {
        let failed = |message: String| TraceError {
            file: file.to_path_buf(),
            line: 1,
            column: 1,
            message: match message.strip_prefix("cannot read: ") {
                Some(why) => format!("cannot read the trace: {why}"),
                None => format!("the trace: {message}"),
            },
        };
        let bytes = gpuscale_policies::load::read_limited(file, MAX_TRACE_BYTES).map_err(failed)?;
        let text = String::from_utf8(bytes).map_err(|e| {
            failed(format!(
                "not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ))
        })?;
        Trace::parse(file, &text)
    }

    /// Parses trace text (a header line, then `timestamp,prompt,output`
    /// rows; the timestamp `YYYY-MM-DD HH:MM:SS[.fraction]` or seconds).
    pub fn parse(file: &Path, text: &str) -> Result<Trace, TraceError> {
        let err = |line: usize, column: usize, message: String| TraceError {
            file: file.to_path_buf(),
            line,
            column,
            message,
        };
        let mut lines = text.lines().enumerate();
        let Some((_, header)) = lines.next() else {
            return Err(err(1, 1, "empty trace: expected a header line".into()));
        };
        let names: Vec<&str> = header.split(',').map(str::trim).collect();
        let expected = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"];
        if names != expected {
            return Err(err(
                1,
                1,
                format!("expected the header `{}`", expected.join(",")),
            ));
        }
        let mut rows = Vec::new();
        let mut first: Option<f64> = None;
        let mut last = f64::NEG_INFINITY;
        for (i, line) in lines {
            let n = i + 1;
            if line.trim().is_empty() {
                continue;
            }
            let fields: Vec<&str> = line.split(',').collect();
            if fields.len() != 3 {
                return Err(err(
                    n,
                    1,
                    format!("expected 3 fields, found {}", fields.len()),
                ));
            }
            let col = |k: usize| fields[..k].iter().map(|f| f.len() + 1).sum::<usize>() + 1;
            let t = timestamp(fields[0].trim())
                .ok_or_else(|| err(n, 1, format!("`{}` is not a timestamp", fields[0])))?;
            let tokens = |k: usize, what: &str| {
                fields[k].trim().parse::<u32>().map_err(|_| {
                    err(
                        n,
                        col(k),
                        format!("{what}: `{}` is not a token count", fields[k]),
                    )
                })
            };
            let prompt = tokens(1, "ContextTokens")?;
            let output = tokens(2, "GeneratedTokens")?;
            // A request is at least its prompt: rows of none are not
            // requests (they would be served in no time and count as met).
            if prompt == 0 {
                return Err(err(
                    n,
                    col(1),
                    "ContextTokens: 0; a request has a prompt of at least one token".into(),
                ));
            }
            if t < last {
                return Err(err(n, 1, "timestamps go backwards".into()));
            }
            last = t;
            let t0 = *first.get_or_insert(t);
            rows.push(TraceRow {
                at: t - t0,
                prompt,
                output,
            });
        }
        if rows.is_empty() {
            return Err(err(2, 1, "the trace has no requests".into()));
        }
        Ok(Trace {
            file: file.to_path_buf(),
            rows,
        })
    }

    /// Seconds from the first request to the last.
    pub fn span(&self) -> f64 {
        self.rows.last().map_or(0.0, |r| r.at)
    }
}

/// Seconds of a `YYYY-MM-DD HH:MM:SS[.fff]` timestamp since a day count
/// epoch (only differences matter), or plain seconds.
fn timestamp(s: &str) -> Option<f64> {
    if let Ok(x) = s.parse::<f64>() {
        return x.is_finite().then_some(x);
    }
    let (date, time) = s.split_once(' ')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    if d.next().is_some() || !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return None;
    }
    let mut t = time.split(':');
    let (h, min, sec) = (
        t.next()?.parse::<u32>().ok()?,
        t.next()?.parse::<u32>().ok()?,
        t.next()?.parse::<f64>().ok()?,
    );
    if t.next().is_some() || h > 23 || min > 59 || !(0.0..61.0).contains(&sec) {
        return None;
    }
    Some(days_from_civil(y, m, day) as f64 * 86_400.0 + f64::from(h * 3600 + min * 60) + sec)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = if y >= 0 { y } else { y - 399 } / 400;
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_azure_rows_as_offsets() {
        let t = Trace::parse(
            Path::new("t.csv"),
            "TIMESTAMP,ContextTokens,GeneratedTokens\n\
             2023-11-16 23:59:59.5000000,374,44\n\
             2023-11-17 00:00:01.0000000,396,109\n",
        )
        .unwrap();
        assert_eq!(t.rows.len(), 2);
        assert_eq!(t.rows[0].at, 0.0);
        assert!((t.rows[1].at - 1.5).abs() < 1e-9, "{}", t.rows[1].at);
        assert_eq!((t.rows[1].prompt, t.rows[1].output), (396, 109));
        // 1970-01-01 is day 0; 2000-03-01 is day 11,017.
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }

    #[test]
    fn bad_rows_are_located() {
        let e = Trace::parse(
            Path::new("t.csv"),
            "TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,12,x\n",
        )
        .unwrap_err();
        assert_eq!((e.line, e.column), (2, 8));
        assert!(
            e.to_string().starts_with("t.csv:2:8: GeneratedTokens"),
            "{e}"
        );
        // A row of no prompt is no request.
        let e = Trace::parse(
            Path::new("t.csv"),
            "TIMESTAMP,ContextTokens,GeneratedTokens\n1.0,12,3\n2.0,0,0\n",
        )
        .unwrap_err();
        assert_eq!((e.line, e.column), (3, 5), "{e}");
        assert!(e.to_string().contains("at least one token"), "{e}");
        let e = Trace::parse(Path::new("t.csv"), "a,b\n").unwrap_err();
        assert_eq!(e.line, 1);
        let e = Trace::parse(
            Path::new("t.csv"),
            "TIMESTAMP,ContextTokens,GeneratedTokens\n5,1,1\n4,1,1\n",
        )
        .unwrap_err();
        assert!(e.message.contains("backwards"), "{e}");
    }
}
