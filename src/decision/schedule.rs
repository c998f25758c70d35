//! The wave schedule of one model turn (DESIGN §7, `BatchAuthorize`): pure
//! rules over the allowed calls' conflict keys, risks and `parallel` flags.

use crate::tools::Risk;

/// One call of a batch, as the scheduler sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleItem {
    pub allowed: bool,
    pub conflict_key: String,
    pub risk: Risk,
    pub parallel: bool,
}

/// The wave schedule of one model turn (DESIGN §7, `BatchAuthorize`): only
/// allowed calls are scheduled; waves run in order, calls in one wave may
/// run together. Two calls on the same conflict key where either is not
/// `read` go in different waves, in request order. A call whose tool is not
/// `parallel` is alone in its wave and, conservatively, a barrier: every
/// earlier call runs before it and every later one after it.
#[must_use]
pub fn schedule(items: &[ScheduleItem]) -> Vec<Vec<usize>> {
    let mut wave_of: Vec<Option<usize>> = Vec::with_capacity(items.len());
    let mut waves: Vec<Vec<usize>> = Vec::new();
    let mut floor = 0usize; // the first wave a new call may join
    for (i, item) in items.iter().enumerate() {
        if !item.allowed {
            wave_of.push(None);
            continue;
        }
        if !item.parallel {
            let w = waves.len().max(floor);
            waves.resize_with(w + 1, Vec::new);
            if let Some(wave) = waves.get_mut(w) {
                wave.push(i);
            }
            wave_of.push(Some(w));
            floor = w + 1;
            continue;
        }
        let mut w = floor;
        for (j, earlier) in items.iter().enumerate().take(i) {
            let Some(Some(wj)) = wave_of.get(j) else {
                continue;
            };
            let conflicts = earlier.conflict_key == item.conflict_key
                && (earlier.risk != Risk::Read || item.risk != Risk::Read);
            if conflicts {
                w = w.max(wj + 1);
            }
        }
        if waves.len() <= w {
            waves.resize_with(w + 1, Vec::new);
        }
        if let Some(wave) = waves.get_mut(w) {
            wave.push(i);
        }
        wave_of.push(Some(w));
    }
    waves.retain(|w| !w.is_empty());
    waves
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(allowed: bool, key: &str, risk: Risk, parallel: bool) -> ScheduleItem {
        ScheduleItem {
            allowed,
            conflict_key: key.into(),
            risk,
            parallel,
        }
    }

    #[test]
    fn writes_on_one_key_are_ordered_and_reads_share_a_wave() {
        let items = [
            item(true, "t:Order:1", Risk::Read, true),
            item(true, "t:Order:1", Risk::Read, true),
            item(true, "t:Order:1", Risk::Write, true),
            item(true, "t:Order:2", Risk::Write, true),
            item(false, "t:Order:2", Risk::Write, true),
            item(true, "t:Order:1", Risk::Read, true),
        ];
        assert_eq!(schedule(&items), vec![vec![0, 1, 3], vec![2], vec![5]]);
    }

    #[test]
    fn a_non_parallel_call_is_alone_and_a_barrier() {
        let items = [
            item(true, "a", Risk::Read, true),
            item(true, "b", Risk::External, false),
            item(true, "c", Risk::Read, true),
            item(true, "d", Risk::Read, true),
        ];
        assert_eq!(schedule(&items), vec![vec![0], vec![1], vec![2, 3]]);
    }

    #[test]
    fn nothing_allowed_means_no_waves() {
        assert!(schedule(&[item(false, "a", Risk::Read, true)]).is_empty());
    }
}
