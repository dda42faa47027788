//! Shrinking a failing seed to a short transcript (delta debugging): the run is replayed with
//! fewer and fewer of its chaos steps, each kept step given back the draws it made in the whole
//! run (so it means to do what it did), as long as the same kind of violation still comes.
//! The quiet phase is always replayed whole: a liveness violation needs all of it.

use super::{RunAs, kind, run};

/// Replays a shrunk replay may make at most: each is one run of the seed.
const MAX_REPLAYS: u32 = 4000;

/// What one step drew: from the harness's generator, and from the world's.
#[derive(Clone, Debug, Default)]
pub(super) struct Draws {
    pub sim: Vec<u64>,
    pub world: Vec<u64>,
}

/// A recorded run replayed with only some of its chaos steps, until a violation of one kind.
pub(super) struct Script {
    /// The chaos steps kept, by their number in the recorded run.
    pub kept: Vec<usize>,
    /// What each step of the recorded run drew, chaos steps first.
    pub tape: Vec<Draws>,
    /// The kind of violation the replay must still show (and stops at).
    pub until: String,
}

/// A failing seed shrunk.
pub(super) struct Shrunk {
    pub kind: String,
    /// The chaos steps of the seed's run, and those the shrunk run keeps.
    pub chaos_steps: usize,
    pub kept: Vec<usize>,
    pub replays: u32,
    /// The shrunk run's transcript, up to its first violation of the kind.
    pub trace: Vec<String>,
}

/// Shrinks the run of `seed` (run as `how` says) to the fewest chaos steps that still show the
/// kind of its first violation; `None` if the seed does not fail.
pub(super) fn shrink(seed: u64, how: RunAs) -> Option<Shrunk> {
    let recorded = run(
        seed,
        RunAs {
            traced: false,
            ..how
        },
    );
    let (step, first) = recorded.violations.first()?;
    let mut script = Script {
        // What came after a violation in the chaos phase cannot have caused it.
        kept: (0..recorded.chaos_steps.min(step + 1)).collect(),
        tape: recorded.tape,
        until: kind(first),
    };
    let replays = std::cell::Cell::new(0);
    let fails = |script: &Script| {
        replays.set(replays.get() + 1);
        let outcome = run(
            seed,
            RunAs {
                traced: false,
                script: Some(script),
                ..how
            },
        );
        outcome
            .violations
            .iter()
            .any(|(_, v)| kind(v) == script.until)
    };
    assert!(
        fails(&script),
        "seed {seed} replayed from its record does not fail as it did"
    );
    // Remove chunks of kept steps, halving the chunk once none of its size can go.
    let mut chunk = script.kept.len().div_ceil(2);
    while chunk > 0 && replays.get() < MAX_REPLAYS {
        let mut removed = false;
        let mut start = 0;
        while start < script.kept.len() && replays.get() < MAX_REPLAYS {
            let end = (start + chunk).min(script.kept.len());
            let cut: Vec<usize> = script.kept.drain(start..end).collect();
            if fails(&script) {
                removed = true;
            } else {
                script.kept.splice(start..start, cut);
                start = end;
            }
        }
        if !removed {
            chunk /= 2;
        }
    }
    let traced = run(
        seed,
        RunAs {
            traced: true,
            script: Some(&script),
            ..how
        },
    );
    Some(Shrunk {
        kind: script.until,
        chaos_steps: recorded.chaos_steps,
        kept: script.kept,
        replays: replays.get(),
        trace: traced.trace,
    })
}

#[cfg(test)]
mod tests {
    use super::super::world::World;
    use super::*;

    /// A violation of the test's own that needs only a few steps: some unit was unloaded
    /// (garbage-collected), which takes the unit dead and its cgroup empty, then one step.
    fn unloaded(w: &World) -> Option<String> {
        let unit = w.units.iter().find(|u| !u.loaded)?;
        Some(format!("TEST RULE: {} was garbage-collected", unit.name))
    }

    #[test]
    fn a_failing_seed_shrinks_to_fewer_steps_that_fail_the_same_way() {
        let how = RunAs {
            rule: Some(unloaded),
            ..RunAs::default()
        };
        // The first seed whose run breaks the rule late in its chaos phase, so that most of
        // what came before has nothing to do with it.
        let (seed, step, recorded) = (0..200)
            .find_map(|seed| {
                let outcome = run(seed, how);
                let step = outcome.violations.first()?.0;
                (step >= 60 && step < outcome.chaos_steps).then_some((seed, step, outcome))
            })
            .expect("a seed breaks the rule late");
        let shrunk = shrink(seed, how).expect("the seed fails");
        assert_eq!(shrunk.kind, kind(&recorded.violations[0].1));
        assert!(
            shrunk.kept.len() < step / 4,
            "seed {seed}: {} steps kept of the {} before the violation: {:?}",
            shrunk.kept.len(),
            step + 1,
            shrunk.kept
        );
        assert!(shrunk.kept.is_sorted(), "a subsequence of the run's steps");
        let last = shrunk.trace.last().expect("a transcript");
        assert!(
            last.starts_with("VIOLATION: TEST RULE") && kind(&last[11..]) == shrunk.kind,
            "the shrunk run ends at the same kind of violation: {last}"
        );
    }
}
