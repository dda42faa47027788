//! What a generation's watch releases once, and only once, its proof is in, as a pure state
//! machine: the generation's launch file is removed, then one final StopUnit is sent unless a
//! stop of ours already succeeded, decided only once no stop of ours is still in flight.
//!
//! A generation (a unit whose number is never reused) leaves files behind: its launch file,
//! which the agent removes, and the control side's drop-in and layout, which a StopUnit of the
//! now inactive unit removes. A stop of ours that succeeded already did the latter, so the
//! final stop is issued only if none did. Stops are asynchronous here, so the decision waits for
//! every stop still in flight at the proof.

/// A fact handed to [`Release`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseInput {
    /// A StopUnit of ours went out.
    StopIssued,
    /// A StopUnit of ours came back, successful or not.
    StopFinished {
        /// systemd accepted the StopUnit.
        succeeded: bool,
    },
    /// The unit is proven gone.
    Proven,
    /// The unit is proven gone because the machine rebooted: its launch file goes, but no
    /// final StopUnit, which would reach whatever runs under the unit's name in this boot.
    ProvenAfterReboot,
}

/// What the driver must do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseOutput {
    /// Remove the generation's launch file (never following a final symlink).
    RemoveLaunchFile,
    /// Issue the final StopUnit of the inactive unit, so the control side removes the
    /// generation's files.
    FinalStop,
}

/// The release of one generation's files.
#[derive(Debug)]
pub struct Release {
    has_launch_file: bool,
    stops_in_flight: u32,
    stop_succeeded: bool,
    proven: bool,
    final_stop_decided: bool,
    outputs: Vec<ReleaseOutput>,
}

impl Release {
    /// The release of a generation, with a launch file or not.
    pub fn new(has_launch_file: bool) -> Self {
        Release {
            has_launch_file,
            stops_in_flight: 0,
            stop_succeeded: false,
            proven: false,
            final_stop_decided: false,
            outputs: Vec::new(),
        }
    }

    /// The release of a generation taken up again after a restart, remembering whether a stop
    /// of ours already succeeded.
    pub fn resume(has_launch_file: bool, stop_succeeded: bool) -> Self {
        Release {
            stop_succeeded,
            ..Release::new(has_launch_file)
        }
    }

    /// Whether a stop of ours succeeded (kept across restarts).
    pub fn stop_succeeded(&self) -> bool {
        self.stop_succeeded
    }

    /// Whether the proof was handed in and the release is not over: what it asks for is not
    /// yet taken, or the final decision waits for a stop of ours in flight. The agent saves
    /// this with the proof, so one killed in between carries the release out after its restart.
    pub fn unfinished(&self) -> bool {
        self.proven
            && (!self.outputs.is_empty() || !self.final_stop_decided || self.stops_in_flight > 0)
    }

    /// Takes in one fact; what it makes the driver do is in [`Release::take_outputs`].
    pub fn handle(&mut self, input: ReleaseInput) {
        match input {
            ReleaseInput::StopIssued => self.stops_in_flight += 1,
            ReleaseInput::StopFinished { succeeded } => {
                self.stops_in_flight = self.stops_in_flight.saturating_sub(1);
                // Only a stop that came back before the final decision counts; the final stop
                // itself comes back after it and changes nothing.
                if !self.final_stop_decided {
                    self.stop_succeeded |= succeeded;
                }
            }
            ReleaseInput::Proven | ReleaseInput::ProvenAfterReboot => {
                if self.proven {
                    return;
                }
                self.proven = true;
                if self.has_launch_file {
                    self.outputs.push(ReleaseOutput::RemoveLaunchFile);
                }
                if input == ReleaseInput::ProvenAfterReboot {
                    self.final_stop_decided = true;
                }
            }
        }
        if self.proven && self.stops_in_flight == 0 && !self.final_stop_decided {
            self.final_stop_decided = true;
            if !self.stop_succeeded {
                self.outputs.push(ReleaseOutput::FinalStop);
            }
        }
    }

    /// Takes what the driver must do now.
    pub fn take_outputs(&mut self) -> Vec<ReleaseOutput> {
        std::mem::take(&mut self.outputs)
    }
}

#[cfg(test)]
mod tests {
    use super::ReleaseInput::*;
    use super::ReleaseOutput::*;
    use super::*;

    fn run(has_launch_file: bool, inputs: &[ReleaseInput]) -> Vec<(usize, ReleaseOutput)> {
        let mut release = Release::new(has_launch_file);
        let mut outputs = Vec::new();
        for (i, input) in inputs.iter().enumerate() {
            release.handle(*input);
            outputs.extend(release.take_outputs().into_iter().map(|o| (i, o)));
        }
        outputs
    }

    #[test]
    fn the_release_follows_the_seed_finalise_gen() {
        let ok = StopFinished { succeeded: true };
        let failed = StopFinished { succeeded: false };
        type Case<'a> = (
            &'a str,
            bool,
            &'a [ReleaseInput],
            &'a [(usize, ReleaseOutput)],
        );
        let cases: &[Case] = &[
            ("nothing before the proof", true, &[StopIssued, ok], &[]),
            (
                "no stop of ours: launch file, then the final stop",
                true,
                &[Proven],
                &[(0, RemoveLaunchFile), (0, FinalStop)],
            ),
            ("no launch file", false, &[Proven], &[(0, FinalStop)]),
            (
                "a stop of ours succeeded: no final stop",
                true,
                &[StopIssued, ok, Proven],
                &[(2, RemoveLaunchFile)],
            ),
            (
                "a stop of ours failed: the final stop still goes out",
                true,
                &[StopIssued, failed, Proven],
                &[(2, RemoveLaunchFile), (2, FinalStop)],
            ),
            (
                "a stop in flight at the proof: decided when it comes back",
                true,
                &[StopIssued, Proven, ok],
                &[(1, RemoveLaunchFile)],
            ),
            (
                "one of two stops in flight succeeds: no final stop",
                false,
                &[StopIssued, StopIssued, Proven, ok, failed],
                &[],
            ),
            (
                "two in flight, both fail",
                false,
                &[StopIssued, StopIssued, Proven, failed, failed],
                &[(4, FinalStop)],
            ),
            (
                "after a reboot: the launch file, and no final stop",
                true,
                &[ProvenAfterReboot, Proven],
                &[(0, RemoveLaunchFile)],
            ),
            (
                "exactly once: a second proof and the final stop's own reply change nothing",
                true,
                &[Proven, Proven, StopIssued, ok, Proven],
                &[(0, RemoveLaunchFile), (0, FinalStop)],
            ),
        ];
        for (name, has_launch_file, inputs, expected) in cases {
            assert_eq!(&run(*has_launch_file, inputs), expected, "{name}");
        }
    }

    /// A release is over only once every stop of ours came back, the final stop included: the
    /// agent saves `unfinished` with the proof, and one killed while the final StopUnit is out
    /// sends it again after its restart (mutants that called it over then survived every other
    /// test: docs/mutation-2026-12-06.md, R4 and R6).
    #[test]
    fn a_release_is_unfinished_until_every_stop_of_ours_came_back() {
        let mut release = Release::new(false);
        assert!(!release.unfinished(), "nothing to release before the proof");
        release.handle(Proven);
        assert!(release.unfinished(), "the final stop not taken yet");
        assert_eq!(release.take_outputs(), [FinalStop]);
        release.handle(StopIssued);
        assert!(release.unfinished(), "the final stop is out");
        release.handle(StopFinished { succeeded: true });
        assert!(!release.unfinished(), "every stop came back");

        let mut release = Release::new(false);
        release.handle(StopIssued);
        release.handle(Proven);
        assert!(release.unfinished(), "a stop of ours is out at the proof");
        release.handle(StopFinished { succeeded: true });
        assert!(
            release.take_outputs().is_empty(),
            "it succeeded: no final stop"
        );
        assert!(!release.unfinished());
    }
}
