//! (in progress)
use super::{CollArgs, CollError, Choice, Comm, Knobs};
use crate::schedule::Schedule;
/// Builds the schedule.
pub fn build(_comm: &Comm, args: &CollArgs, choice: &Choice, _knobs: &Knobs) -> Result<Schedule, CollError> {
    Err(CollError::Unsupported { algo: choice.algo, coll: args.coll, hint: "in progress".into() })
}
