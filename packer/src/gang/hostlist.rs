//! Node names in Slurm's hostlist form, as `squeue`'s NODELIST and
//! `scontrol show hostlist` print them (slurm/src/common/hostlist.c):
//! names that differ only in a trailing number share their prefix, their
//! numbers sorted and runs written as ranges (`h100-[0-3,7]`).

/// `nodes` as one hostlist: a 64-GPU gang's eight nodes take one short
/// field. A number written with leading zeros keeps its width
/// (`node[01-03]`), and a number of that many digits without them joins
/// it (`node-[02-12]`), as Slurm's equivalent widths do; other widths are
/// grouped apart. Names without a trailing number are kept as they are;
/// groups appear in the order of their first node; repeats count once.
pub fn hostlist<S: AsRef<str>>(nodes: &[S]) -> String {
    enum Entry<'a> {
        /// Prefix, width of zero-padded numbers (0: unpadded), numbers.
        Numbered(&'a str, usize, Vec<u64>),
        Plain(&'a str),
    }
    // A name split at its trailing number, if it has one that fits u64.
    let split = |name: &str| -> Option<(usize, u64, usize)> {
        let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
        let number = &name[name.len() - digits..];
        let n = number.parse::<u64>().ok()?;
        let padded = if digits > 1 && number.starts_with('0') {
            digits
        } else {
            0
        };
        Some((name.len() - digits, n, padded))
    };
    // The padded widths each prefix is written with.
    let mut widths: Vec<(&str, usize)> = Vec::new();
    for name in nodes {
        let name = name.as_ref();
        if let Some((at, _, w)) = split(name)
            && w > 0
            && !widths.contains(&(&name[..at], w))
        {
            widths.push((&name[..at], w));
        }
    }
    let mut entries: Vec<Entry> = Vec::new();
    for name in nodes {
        let name = name.as_ref();
        let Some((at, n, padded)) = split(name) else {
            if !entries
                .iter()
                .any(|e| matches!(e, Entry::Plain(p) if *p == name))
            {
                entries.push(Entry::Plain(name));
            }
            continue;
        };
        let prefix = &name[..at];
        let digits = name.len() - at;
        let width = if padded > 0 || widths.contains(&(prefix, digits)) {
            digits
        } else {
            0
        };
        let group = entries.iter_mut().find_map(|e| match e {
            Entry::Numbered(p, w, ns) if *p == prefix && *w == width => Some(ns),
            _ => None,
        });
        match group {
            Some(ns) => ns.push(n),
            None => entries.push(Entry::Numbered(prefix, width, vec![n])),
        }
    }
    let text = |e: Entry| match e {
        Entry::Plain(name) => name.to_string(),
        Entry::Numbered(prefix, width, mut ns) => {
            ns.sort_unstable();
            ns.dedup();
            let num = |n: u64| format!("{n:0width$}");
            let mut ranges: Vec<String> = Vec::new();
            let mut k = 0;
            while k < ns.len() {
                let mut j = k;
                while j + 1 < ns.len() && ns[j + 1] == ns[j] + 1 {
                    j += 1;
                }
                ranges.push(if j == k {
                    num(ns[k])
                } else {
                    format!("{}-{}", num(ns[k]), num(ns[j]))
                });
                k = j + 1;
            }
            if ns.len() == 1 {
                format!("{prefix}{}", ranges[0])
            } else {
                format!("{prefix}[{}]", ranges.join(","))
            }
        }
    };
    entries.into_iter().map(text).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::hostlist;

    // Expected strings in the form of Slurm's `scontrol show hostlist`
    // (slurm/src/common/hostlist.c): a prefix, then `[` ranges `]`.
    #[test]
    fn runs_of_numbered_nodes_are_ranges() {
        assert_eq!(hostlist(&["h100-2", "h100-3"]), "h100-[2-3]");
        assert_eq!(
            hostlist(&["h100-7", "h100-0", "h100-1", "h100-2", "h100-3", "h100-10"]),
            "h100-[0-3,7,10]"
        );
        assert_eq!(hostlist(&["a100-0"]), "a100-0");
        assert_eq!(hostlist(&["a100-0", "a100-0"]), "a100-0");
    }

    #[test]
    fn equivalent_widths_join_and_others_stay_apart_in_order() {
        // 10–12 have the two digits 02–09 are padded to: one range.
        let names: Vec<String> = (2..=12).map(|i| format!("node-{i:02}")).collect();
        assert_eq!(hostlist(&names), "node-[02-12]");
        assert_eq!(
            hostlist(&["node01", "node02", "node03", "gpu-9", "node10", "node100"]),
            "node[01-03,10],gpu-9,node100"
        );
        assert_eq!(
            hostlist(&["login", "h100-1", "h100-2", "login"]),
            "login,h100-[1-2]"
        );
        assert_eq!(
            hostlist(&["x99999999999999999999999"]),
            "x99999999999999999999999"
        );
    }
}
