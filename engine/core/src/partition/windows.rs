//! Window arithmetic (`qstate.core.windows`): Spark's `window(time, size, slide)` with no
//! start offset, windows half-open `[start, start + size)`. Python's `%` is a floor modulo:
//! `rem_euclid` here, for a positive step.

/// The tag of a (sub-)pane whose events count in every window that covers it.
pub const ALL_WINDOWS: i64 = i64::MIN;

pub fn floor_to(t: i128, step: i128) -> i128 {
    t - t.rem_euclid(step)
}

/// Start of the oldest window that contains `t`.
pub fn first_window_of(t: i128, size: i128, slide: i128) -> i128 {
    floor_to(t - size, slide) + slide
}

/// Start of the newest window that contains `t`.
pub fn last_window_of(t: i128, slide: i128) -> i128 {
    floor_to(t, slide)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_times_floor() {
        assert_eq!(floor_to(-1, 10), -10);
        assert_eq!(first_window_of(5, 60, 10), -50);
        assert_eq!(last_window_of(-5, 10), -10);
    }
}
