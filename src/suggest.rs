//! "Did you mean": the one helper that picks the candidate nearest to a misspelt word, for
//! every such hint (scenario keys and values, NCCL variables, file names, CSV columns and
//! values). Distances are strsim's Levenshtein over lowercase text.
//!
//! Architecture invariant: pure string functions; knows nothing of what the words name.

/// The candidate nearest to `word`, if one is close enough to be a typo: a case-insensitive
/// match; else the smallest edit distance (ties to the shorter, then the first candidate)
/// when it is at most a third of the word's length (at least 2) and smaller than the word;
/// else a candidate that contains the word (3 characters or more) or is contained in it.
pub fn nearest<'a, I>(word: &str, candidates: I) -> Option<&'a str>
where
    I: IntoIterator<Item = &'a str>,
    I::IntoIter: Clone,
{
    let candidates = candidates.into_iter();
    let lw = word.to_lowercase();
    if let Some(c) = candidates.clone().find(|c| c.to_lowercase() == lw) {
        return Some(c);
    }
    let len = lw.chars().count();
    let best = candidates
        .clone()
        .enumerate()
        .map(|(i, c)| (strsim::levenshtein(&lw, &c.to_lowercase()), c.chars().count(), i, c))
        .min();
    if let Some((d, _, _, c)) = best {
        if d <= (len / 3).max(2) && d < len {
            return Some(c);
        }
    }
    if len >= 3 {
        return candidates.clone().find(|c| {
            let lc = c.to_lowercase();
            lc.contains(&lw) || (lc.chars().count() >= 3 && lw.contains(&lc))
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::nearest;

    #[test]
    fn typos_case_and_containment() {
        let keys = ["fidelity", "seed", "granularity", "fold_channels"];
        assert_eq!(nearest("fidelty", keys), Some("fidelity"));
        assert_eq!(nearest("SEED", keys), Some("seed"));
        assert_eq!(nearest("zzzzzzzz", keys), None);
        assert_eq!(nearest("x", keys), None);
        let cols = ["size_bytes", "busbw_GBps", "algbw_GBps"];
        assert_eq!(nearest("busbw", cols), Some("busbw_GBps"));
        assert_eq!(nearest("sise_bytes", cols), Some("size_bytes"));
        // Ties go to the shorter candidate, then the first.
        assert_eq!(nearest("ab", ["abcd", "abc"]), Some("abc"));
        assert_eq!(nearest("NCCL_ALGOS", ["NCCL_PROTO", "NCCL_ALGO"]), Some("NCCL_ALGO"));
    }
}
