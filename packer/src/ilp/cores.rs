//! Independent searches of one solve spread over the machine's cores.
//!
//! Column generation's pricing knapsacks (one per class and round) and the
//! local search over each plan the dive found are independent of each
//! other: [`map`] runs them on scoped threads and returns the results in
//! input order, so what the caller does with them, and so the plan, does
//! not depend on the number of cores.

/// `f` of each item, in order, on up to as many threads as the machine
/// has cores (items dealt out in turn; the calling thread takes its share).
pub fn map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(items.len());
    if threads <= 1 {
        return items.iter().map(f).collect();
    }
    let f = &f;
    let mut out: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    std::thread::scope(|scope| {
        let workers: Vec<_> = (1..threads)
            .map(|w| {
                scope.spawn(move || {
                    (w..items.len())
                        .step_by(threads)
                        .map(|i| (i, f(&items[i])))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for i in (0..items.len()).step_by(threads) {
            out[i] = Some(f(&items[i]));
        }
        for worker in workers {
            // A panic in a search is the solve's own panic.
            let done = worker
                .join()
                .unwrap_or_else(|e| std::panic::resume_unwind(e));
            for (i, r) in done {
                out[i] = Some(r);
            }
        }
    });
    out.into_iter()
        .map(|r| r.expect("every item mapped"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_come_back_in_input_order_whatever_the_threads() {
        let items: Vec<u64> = (0..37).collect();
        let squares = map(&items, |&x| {
            // Uneven work, so the threads finish out of order.
            std::thread::sleep(std::time::Duration::from_micros((37 - x) * 50));
            x * x
        });
        assert_eq!(squares, items.iter().map(|x| x * x).collect::<Vec<_>>());
        assert!(map(&[] as &[u64], |&x| x).is_empty());
        assert_eq!(map(&[5u64], |&x| x + 1), vec![6]);
    }
}
