//! Units of the simulation: time as integer picoseconds, byte counts and bandwidths,
//! and the parsers for the human spellings users type ("8G", "400Gbps", "1.5us").
//!
//! Architecture invariant: this module depends on nothing else in the crate. Time never
//! becomes a float inside the engine; floats appear only where a user-facing value is
//! converted (GB/s in a report, "1.5us" in a file).

use std::fmt;
use std::ops::{Add, AddAssign, Sub};

/// A point in simulated time, or a duration, in integer picoseconds.
///
/// `+` and the serialisation times saturate at [`SimTime::MAX`] so that the engine's hot path
/// needs no branch or panic; [`SimTime::MAX`] therefore means "overflowed", and a backend
/// that ends at it reports [`TimeOverflow`] instead of a number. Code outside the hot path
/// uses the checked forms ([`SimTime::checked_add`], [`SimTime::checked_from_us_f64`],
/// [`Bandwidth::checked_time_for`]).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct SimTime(pub u64);

/// A time beyond what [`SimTime`] holds (2^64 - 1 ps, about 213 days): an error, never a
/// number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the simulated time overflows: it exceeds the largest time fabricsim represents \
     (2^64 - 1 ps, about 213 days); use smaller sizes"
)]
pub struct TimeOverflow;

impl SimTime {
    /// Time zero.
    pub const ZERO: SimTime = SimTime(0);
    /// The largest representable time (about 213 days).
    pub const MAX: SimTime = SimTime(u64::MAX);

    /// From picoseconds.
    pub const fn from_ps(ps: u64) -> SimTime {
        SimTime(ps)
    }
    /// From nanoseconds.
    pub const fn from_ns(ns: u64) -> SimTime {
        SimTime(ns * 1_000)
    }
    /// From microseconds (rounded to the nearest picosecond).
    pub fn from_us_f64(us: f64) -> SimTime {
        SimTime((us * 1e6).round().max(0.0) as u64)
    }
    /// From microseconds, or [`TimeOverflow`] when the value is not finite or does not fit
    /// (negative values are zero, as in [`SimTime::from_us_f64`]).
    pub fn checked_from_us_f64(us: f64) -> Result<SimTime, TimeOverflow> {
        let ps = (us * 1e6).round();
        // u64::MAX as f64 rounds up to 2^64, so `<` keeps every accepted value in range;
        // u64::MAX itself is the saturation mark and is not a valid result either.
        if ps.is_nan() || ps >= u64::MAX as f64 {
            return Err(TimeOverflow);
        }
        Ok(SimTime(ps.max(0.0) as u64))
    }
    /// `self + other`, or [`TimeOverflow`].
    pub fn checked_add(self, other: SimTime) -> Result<SimTime, TimeOverflow> {
        match self.0.checked_add(other.0) {
            Some(t) if t < u64::MAX => Ok(SimTime(t)),
            _ => Err(TimeOverflow),
        }
    }
    /// Whether this time is the saturation mark, [`SimTime::MAX`]: a result that overflowed.
    pub const fn is_saturated(self) -> bool {
        self.0 == u64::MAX
    }
    /// Picoseconds.
    pub const fn ps(self) -> u64 {
        self.0
    }
    /// Microseconds as a float (for reports only).
    pub fn as_us(self) -> f64 {
        self.0 as f64 / 1e6
    }
    /// Seconds as a float (for reports only).
    pub fn as_secs(self) -> f64 {
        self.0 as f64 / 1e12
    }
    /// `self - other`, or zero when `other` is later.
    pub fn saturating_sub(self, other: SimTime) -> SimTime {
        SimTime(self.0.saturating_sub(other.0))
    }
}

impl Add for SimTime {
    type Output = SimTime;
    fn add(self, rhs: SimTime) -> SimTime {
        SimTime(self.0.saturating_add(rhs.0))
    }
}
impl AddAssign for SimTime {
    fn add_assign(&mut self, rhs: SimTime) {
        self.0 = self.0.saturating_add(rhs.0);
    }
}
impl Sub for SimTime {
    type Output = SimTime;
    fn sub(self, rhs: SimTime) -> SimTime {
        SimTime(self.0.saturating_sub(rhs.0))
    }
}

impl fmt::Debug for SimTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for SimTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ps = self.0 as f64;
        if self.0 < 1_000 {
            write!(f, "{} ps", self.0)
        } else if self.0 < 1_000_000 {
            write!(f, "{:.3} ns", ps / 1e3)
        } else if self.0 < 1_000_000_000 {
            write!(f, "{:.3} us", ps / 1e6)
        } else if self.0 < 1_000_000_000_000 {
            write!(f, "{:.3} ms", ps / 1e9)
        } else {
            write!(f, "{:.3} s", ps / 1e12)
        }
    }
}

/// A bandwidth in bytes per second (one direction of a link unless stated otherwise).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Bandwidth(pub u64);

impl Bandwidth {
    /// From GB/s (10^9 bytes per second).
    pub fn from_gbytes(gbps: f64) -> Bandwidth {
        Bandwidth((gbps * 1e9).round().max(0.0) as u64)
    }
    /// From Gb/s (10^9 bits per second).
    pub fn from_gbits(gbits: f64) -> Bandwidth {
        Bandwidth((gbits * 1e9 / 8.0).round().max(0.0) as u64)
    }
    /// Bytes per second.
    pub const fn bytes_per_sec(self) -> u64 {
        self.0
    }
    /// GB/s as a float (for reports).
    pub fn gbytes(self) -> f64 {
        self.0 as f64 / 1e9
    }
    /// This bandwidth scaled by a factor (efficiencies, shares).
    pub fn scaled(self, factor: f64) -> Bandwidth {
        Bandwidth((self.0 as f64 * factor).round().max(0.0) as u64)
    }
    /// Picoseconds per byte as a 32.32 fixed-point number (rounded up), for the engine's hot
    /// path: `time = ceil(bytes * q / 2^32)` needs one multiplication and no division.
    pub fn ps_per_byte_q32(self) -> u64 {
        if self.0 == 0 {
            return u64::MAX;
        }
        let q = (1_000_000_000_000u128 << 32).div_ceil(self.0 as u128);
        q.min(u64::MAX as u128) as u64
    }

    /// Serialisation time from a [`Bandwidth::ps_per_byte_q32`] value.
    #[inline]
    pub fn time_q32(q: u64, bytes: u64) -> SimTime {
        if q == u64::MAX && bytes > 0 {
            return SimTime::MAX;
        }
        let t = (bytes as u128 * q as u128 + (1u128 << 32) - 1) >> 32;
        SimTime(t.min(u64::MAX as u128) as u64)
    }

    /// Time to serialise `bytes` at this rate, or [`TimeOverflow`] (a zero rate with bytes to
    /// send never finishes, which is an overflow too).
    pub fn checked_time_for(self, bytes: u64) -> Result<SimTime, TimeOverflow> {
        if bytes == 0 {
            return Ok(SimTime::ZERO);
        }
        if self.0 == 0 {
            return Err(TimeOverflow);
        }
        let ps = (bytes as u128 * 1_000_000_000_000u128).div_ceil(self.0 as u128);
        if ps >= u64::MAX as u128 {
            return Err(TimeOverflow);
        }
        Ok(SimTime(ps as u64))
    }

    /// Time to serialise `bytes` at this rate, rounded up to a whole picosecond.
    /// A zero bandwidth is treated as infinitely slow and yields [`SimTime::MAX`].
    pub fn time_for(self, bytes: u64) -> SimTime {
        if bytes == 0 {
            return SimTime::ZERO;
        }
        if self.0 == 0 {
            return SimTime::MAX;
        }
        let num = bytes as u128 * 1_000_000_000_000u128;
        let ps = num.div_ceil(self.0 as u128);
        SimTime(ps.min(u64::MAX as u128) as u64)
    }
}

impl fmt::Debug for Bandwidth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

impl fmt::Display for Bandwidth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:.1} GB/s", self.gbytes())
    }
}

/// Error from parsing a unit string; says what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot read {what} from {input:?}: {hint}")]
pub struct UnitError {
    /// What kind of quantity was expected.
    pub what: &'static str,
    /// The text that failed.
    pub input: String,
    /// What would have been valid.
    pub hint: &'static str,
}

fn split_number(s: &str) -> Option<(f64, &str)> {
    let s = s.trim();
    let end = s
        .char_indices()
        .find(|&(_, c)| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == 'E' || c == '_'))
        .map(|(i, _)| i)
        .unwrap_or(s.len());
    // "1e3" is a number, but "1E" alone followed by nothing is handled by parse failing.
    let (num, rest) = s.split_at(end);
    let num: String = num.chars().filter(|&c| c != '_').collect();
    let v: f64 = num.parse().ok()?;
    if !v.is_finite() {
        return None;
    }
    Some((v, rest.trim()))
}

const BYTES_HINT: &str = "a non-negative byte count such as 8, 4096, 64K, 8M, 8G, 1GiB or 1.5GB \
(K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024 as in nccl-tests; KB/MB/GB/TB are powers of 1000)";

/// Parses a byte count: `8`, `64K`, `8M`, `8G` (binary multiples as in nccl-tests' `-b/-e`),
/// `1GiB` (binary) or `1.5GB` (decimal).
pub fn parse_bytes(s: &str) -> Result<u64, UnitError> {
    let err = || UnitError { what: "a byte count", input: s.to_string(), hint: BYTES_HINT };
    if s.trim_start().starts_with('-') {
        return Err(err());
    }
    let (v, unit) = split_number(s).ok_or_else(err)?;
    let mult: f64 = match unit {
        "" | "B" | "b" => 1.0,
        "K" | "k" | "KiB" => 1024.0,
        "M" | "m" | "MiB" => 1024.0 * 1024.0,
        "G" | "g" | "GiB" => 1024.0 * 1024.0 * 1024.0,
        "T" | "t" | "TiB" => 1024.0f64.powi(4),
        "KB" | "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => return Err(err()),
    };
    let bytes = v * mult;
    if bytes < 0.0 || bytes > u64::MAX as f64 || bytes.fract() != 0.0 {
        return Err(err());
    }
    Ok(bytes as u64)
}

const BW_HINT: &str = "a positive bandwidth such as 400Gbps, 200Gb/s, 50GB/s, 450GBps, 25 GB/s or \
3.35TB/s (bps/b/s are bits per second, Bps/B/s are bytes per second)";

/// Parses a bandwidth: `400Gbps`, `400Gb/s` (bits) or `50GB/s`, `50GBps` (bytes).
pub fn parse_bandwidth(s: &str) -> Result<Bandwidth, UnitError> {
    let err = || UnitError { what: "a bandwidth", input: s.to_string(), hint: BW_HINT };
    let (v, unit) = split_number(s).ok_or_else(err)?;
    let unit = unit.replace(' ', "");
    let (prefix, bits) = if let Some(p) = unit.strip_suffix("bps").or(unit.strip_suffix("b/s")) {
        (p.to_string(), true)
    } else if let Some(p) = unit.strip_suffix("Bps").or(unit.strip_suffix("B/s")) {
        (p.to_string(), false)
    } else {
        return Err(err());
    };
    let mult = match prefix.as_str() {
        "" => 1.0,
        "K" | "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        _ => return Err(err()),
    };
    let bytes_per_sec = v * mult / if bits { 8.0 } else { 1.0 };
    if bytes_per_sec <= 0.0 || !bytes_per_sec.is_finite() {
        return Err(err());
    }
    Ok(Bandwidth(bytes_per_sec.round() as u64))
}

const TIME_HINT: &str = "a non-negative duration such as 0, 150ns, 1.5us, 2ms or 500ps";

/// Parses a duration: `150ns`, `1.5us` (or `µs`), `2ms`, `1s`, `500ps`.
pub fn parse_time(s: &str) -> Result<SimTime, UnitError> {
    let err = || UnitError { what: "a duration", input: s.to_string(), hint: TIME_HINT };
    if s.trim_start().starts_with('-') {
        return Err(err());
    }
    let (v, unit) = split_number(s).ok_or_else(err)?;
    let mult = match unit {
        "ps" => 1.0,
        "ns" => 1e3,
        "us" | "µs" => 1e6,
        "ms" => 1e9,
        "s" => 1e12,
        "" if v == 0.0 => 0.0,
        _ => return Err(err()),
    };
    let ps = v * mult;
    if !(0.0..u64::MAX as f64).contains(&ps) {
        return Err(err());
    }
    Ok(SimTime(ps.round() as u64))
}

/// Parses a FLOP rate such as `989.5T` (TFLOP/s), `67T`, `1.2P`, `500G`.
pub fn parse_flops(s: &str) -> Result<f64, UnitError> {
    let err = || UnitError {
        what: "a FLOP/s rate",
        input: s.to_string(),
        hint: "a positive rate such as 989.5T, 67T, 1.2P or 500G (optionally followed by FLOPS)",
    };
    let (v, unit) = split_number(s).ok_or_else(err)?;
    let unit = unit.trim_end_matches("FLOP/s").trim_end_matches("FLOPS").trim_end_matches("flops");
    let mult = match unit.trim() {
        "" => 1.0,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        _ => return Err(err()),
    };
    if v <= 0.0 {
        return Err(err());
    }
    Ok(v * mult)
}

/// Bytes as GiB (2^30 bytes), for reports.
pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

/// Formats a byte count the way nccl-tests users read sizes: `8 B`, `64 KiB`, `8 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if v.fract() == 0.0 {
        format!("{} {}", v as u64, UNITS[i])
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

/// Compact byte label for plot axes: `8B`, `64K`, `8M`, `8G`.
pub fn format_bytes_short(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "K", "M", "G", "T"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if v.fract() == 0.0 {
        format!("{}{}", v as u64, UNITS[i])
    } else {
        format!("{v:.1}{}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_parse_like_nccl_tests() {
        assert_eq!(parse_bytes("8").unwrap(), 8);
        assert_eq!(parse_bytes("64K").unwrap(), 65536);
        assert_eq!(parse_bytes("8G").unwrap(), 8 << 30);
        assert_eq!(parse_bytes("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_bytes("1.5GB").unwrap(), 1_500_000_000);
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("8X").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("0.5").is_err());
    }

    #[test]
    fn bandwidth_parse_bits_and_bytes() {
        assert_eq!(parse_bandwidth("400Gbps").unwrap().gbytes(), 50.0);
        assert_eq!(parse_bandwidth("400Gb/s").unwrap().gbytes(), 50.0);
        assert_eq!(parse_bandwidth("450GB/s").unwrap().gbytes(), 450.0);
        assert_eq!(parse_bandwidth("3.35TB/s").unwrap().gbytes(), 3350.0);
        assert!(parse_bandwidth("0Gbps").is_err());
        assert!(parse_bandwidth("-5GB/s").is_err());
        assert!(parse_bandwidth("400").is_err());
    }

    #[test]
    fn time_parse_and_transfer_time() {
        assert_eq!(parse_time("1.5us").unwrap(), SimTime(1_500_000));
        assert_eq!(parse_time("150ns").unwrap(), SimTime(150_000));
        assert_eq!(parse_time("0").unwrap(), SimTime(0));
        assert!(parse_time("-1us").is_err());
        // 1 GB at 1 GB/s is one second.
        assert_eq!(Bandwidth::from_gbytes(1.0).time_for(1_000_000_000), SimTime(1_000_000_000_000));
        // Rounds up.
        assert_eq!(Bandwidth(3).time_for(1), SimTime(333_333_333_334));
        assert_eq!(Bandwidth(0).time_for(1), SimTime::MAX);
    }

    #[test]
    fn checked_time_is_an_error_never_a_saturated_number() {
        assert_eq!(SimTime::checked_from_us_f64(1.5), Ok(SimTime(1_500_000)));
        assert_eq!(SimTime::checked_from_us_f64(-3.0), Ok(SimTime::ZERO));
        assert_eq!(SimTime::checked_from_us_f64(2e13), Err(TimeOverflow));
        assert_eq!(SimTime::checked_from_us_f64(f64::INFINITY), Err(TimeOverflow));
        assert_eq!(SimTime::checked_from_us_f64(f64::NAN), Err(TimeOverflow));
        assert_eq!(SimTime(5).checked_add(SimTime(6)), Ok(SimTime(11)));
        assert_eq!(SimTime(u64::MAX - 1).checked_add(SimTime(1)), Err(TimeOverflow));
        assert_eq!(SimTime::MAX.checked_add(SimTime::ZERO), Err(TimeOverflow));
        assert_eq!(Bandwidth(0).checked_time_for(1), Err(TimeOverflow));
        assert_eq!(Bandwidth(0).checked_time_for(0), Ok(SimTime::ZERO));
        assert_eq!(Bandwidth(3).checked_time_for(1), Ok(SimTime(333_333_333_334)));
        // 2^63 bytes at 400 Gb/s: about 213 days plus; does not fit.
        assert_eq!(Bandwidth::from_gbits(400.0).checked_time_for(1 << 63), Err(TimeOverflow));
        assert!((SimTime(u64::MAX - 1) + SimTime(7)).is_saturated());
        assert!(!SimTime(u64::MAX - 1).is_saturated());
        assert!(parse_time("1e30s").is_err());
    }

    #[test]
    fn formatting() {
        assert_eq!(format_bytes(8), "8 B");
        assert_eq!(format_bytes(8 << 30), "8 GiB");
        assert_eq!(format_bytes_short(64 << 10), "64K");
        assert_eq!(format!("{}", SimTime(1_500_000)), "1.500 us");
    }
}
