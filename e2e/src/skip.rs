//! A test never passes by being skipped: when the machine lacks something the test needs
//! (a privilege, a package, a built binary), the test fails, naming what is missing and the
//! command that provides it, CI or not.

use std::fmt::Display;

/// Call where the test cannot go on for lack of `reason`, which names the command that
/// provides it; the test fails.
#[track_caller]
pub fn required(reason: impl Display) -> ! {
    panic!("this test needs what the machine lacks: {reason}");
}
