//! Choosing tokens from logits.

/// The id of the largest logit; the lowest id wins a tie (as llama.cpp's greedy sampler).
pub fn argmax(logits: &[f32]) -> i32 {
    let mut best = 0_usize;
    for (index, &value) in logits.iter().enumerate().skip(1) {
        if value > logits[best] {
            best = index;
        }
    }
    best as i32
}

/// The `k` largest logits as `(token, logit)`, largest first, lowest id first on ties.
pub fn top_k(logits: &[f32], k: usize) -> Vec<(i32, f32)> {
    let mut order: Vec<usize> = (0..logits.len()).collect();
    let k = k.min(logits.len());
    if k == 0 {
        return Vec::new();
    }
    let by_logit = |a: &usize, b: &usize| logits[*b].total_cmp(&logits[*a]).then(a.cmp(b));
    order.select_nth_unstable_by(k - 1, by_logit);
    order.truncate(k);
    order.sort_by(by_logit);
    order
        .into_iter()
        .map(|index| (index as i32, logits[index]))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_prefers_the_lowest_id_on_ties() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
        assert_eq!(argmax(&[5.0]), 0);
    }

    #[test]
    fn top_k_is_sorted_and_bounded() {
        assert_eq!(
            top_k(&[1.0, 3.0, 2.0, 3.0], 3),
            vec![(1, 3.0), (3, 3.0), (2, 2.0)]
        );
        assert_eq!(top_k(&[1.0], 5), vec![(0, 1.0)]);
        assert!(top_k(&[1.0], 0).is_empty());
    }
}
