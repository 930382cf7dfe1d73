//! Chrome trace JSON (the format Perfetto and `chrome://tracing` open) for timelines of
//! ranks, links and switches.
//!
//! Each [`Track`] becomes a thread; tracks are grouped into processes by their `group` (or,
//! without one, by their kind: "ranks", "links", "switches"). Slices are `"ph":"X"`
//! complete events with microsecond timestamps carrying the full picosecond precision of
//! [`SimTime`] as decimals. `"M"` metadata events name and order the processes and threads.
//!
//! The writer streams: events go straight to the underlying writer, so a trace of millions
//! of slices needs no more memory than the tracks. Output is deterministic: the same tracks
//! and slices in the same order give the same bytes.
//!
//! Chrome's format requires slices on one thread to nest properly. Links often carry
//! overlapping transfers, so the writer spreads a track's slices over extra *lanes* (extra
//! threads named `"name #2"`, `"name #3"`, ...) whenever a slice would partially overlap one
//! already written; nested or disjoint slices stay on the track's first lane.

use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::units::SimTime;

/// What a track stands for; it decides the default process a track is grouped under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TrackKind {
    /// A GPU rank.
    Rank,
    /// A link (one direction).
    Link,
    /// A switch (its reduction or multicast engine).
    Switch,
    /// Anything else.
    Other,
}

impl TrackKind {
    fn default_group(self) -> &'static str {
        match self {
            TrackKind::Rank => "ranks",
            TrackKind::Link => "links",
            TrackKind::Switch => "switches",
            TrackKind::Other => "other",
        }
    }
}

/// One timeline row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Track {
    /// Name shown in the viewer, e.g. `"rank 3"` or `"gpu0->nvswitch1"`.
    pub name: String,
    /// What it stands for.
    pub kind: TrackKind,
    /// Process it is grouped under (e.g. `"node 0"`); `None` groups by kind.
    pub group: Option<String>,
}

impl Track {
    /// A track grouped by its kind.
    pub fn new(name: impl Into<String>, kind: TrackKind) -> Track {
        Track { name: name.into(), kind, group: None }
    }
    /// The same track in a named group.
    pub fn in_group(mut self, group: impl Into<String>) -> Track {
        self.group = Some(group.into());
        self
    }
}

/// One complete event on a track.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    /// Index into the track list.
    pub track: usize,
    /// Slice name, e.g. `"send chunk 3"`.
    pub name: String,
    /// Category (`"cat"`), e.g. `"send"`, `"reduce"`, `"compute"`.
    pub category: String,
    /// Start time.
    pub start: SimTime,
    /// Duration.
    pub duration: SimTime,
    /// Extra key/value pairs shown in the viewer.
    pub args: Vec<(String, String)>,
}

/// Why a trace could not be written.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// Writing failed.
    #[error("cannot write trace {}: {source}", path.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "output".into()))]
    Io {
        /// The file, when writing to one.
        path: Option<PathBuf>,
        /// The I/O error.
        source: io::Error,
    },
    /// A slice names a track that does not exist.
    #[error("slice {name:?} refers to track {track}, but there are only {tracks} tracks (0..{tracks})")]
    BadTrack {
        /// The slice name.
        name: String,
        /// Its track index.
        track: usize,
        /// The number of tracks.
        tracks: usize,
    },
}

impl From<io::Error> for TraceError {
    fn from(source: io::Error) -> TraceError {
        TraceError::Io { path: None, source }
    }
}

/// Open slices of one lane of a track: a stack of end times of the slices enclosing the
/// latest one, and the start of the latest slice.
#[derive(Debug, Default, Clone)]
struct Lane {
    tid: u64,
    last_start: u64,
    open_ends: Vec<u64>,
}

#[derive(Debug, Clone)]
struct TrackState {
    pid: u64,
    sort_base: u64,
    lanes: Vec<Lane>,
}

/// A streaming Chrome trace writer. Call [`TraceWriter::slice`] for every slice, then
/// [`TraceWriter::finish`]; a trace that is not finished is not valid JSON.
pub struct TraceWriter<W: Write> {
    out: W,
    tracks: Vec<Track>,
    state: Vec<TrackState>,
    next_tid: u64,
    first_event: bool,
    slices: u64,
}

/// Appends `ps` picoseconds as microseconds with up to six decimals (`1.5`, `0.000001`).
fn push_us(buf: &mut String, ps: u64) {
    use std::fmt::Write as _;
    let whole = ps / 1_000_000;
    let frac = ps % 1_000_000;
    if frac == 0 {
        let _ = write!(buf, "{whole}");
    } else {
        let digits = format!("{frac:06}");
        let _ = write!(buf, "{whole}.{}", digits.trim_end_matches('0'));
    }
}

/// Appends `s` as a JSON string literal.
fn push_json_str(buf: &mut String, s: &str) {
    use std::fmt::Write as _;
    buf.push('"');
    for c in s.chars() {
        match c {
            '"' => buf.push_str("\\\""),
            '\\' => buf.push_str("\\\\"),
            '\n' => buf.push_str("\\n"),
            '\r' => buf.push_str("\\r"),
            '\t' => buf.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(buf, "\\u{:04x}", c as u32);
            }
            c => buf.push(c),
        }
    }
    buf.push('"');
}

impl<W: Write> TraceWriter<W> {
    /// Starts a trace on `out` (wrap files in a `BufWriter`) and writes the metadata naming
    /// every process and track.
    pub fn new(out: W, tracks: &[Track]) -> Result<TraceWriter<W>, TraceError> {
        let mut w = TraceWriter {
            out,
            tracks: tracks.to_vec(),
            state: Vec::with_capacity(tracks.len()),
            next_tid: tracks.len() as u64 + 1,
            first_event: true,
            slices: 0,
        };
        w.out.write_all(b"{\"displayTimeUnit\":\"ns\",\"traceEvents\":[")?;
        // Processes in order of first appearance of their group.
        let mut groups: Vec<String> = Vec::new();
        for t in tracks {
            let g = t.group.clone().unwrap_or_else(|| t.kind.default_group().to_string());
            let pid = match groups.iter().position(|x| *x == g) {
                Some(i) => i as u64 + 1,
                None => {
                    groups.push(g);
                    groups.len() as u64
                }
            };
            w.state.push(TrackState { pid, sort_base: 0, lanes: Vec::new() });
        }
        for (i, g) in groups.iter().enumerate() {
            let pid = i as u64 + 1;
            let mut e = String::new();
            e.push_str("{\"ph\":\"M\",\"pid\":");
            e.push_str(&pid.to_string());
            e.push_str(",\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":");
            push_json_str(&mut e, g);
            e.push_str("}}");
            w.event(&e)?;
            let e = format!(
                "{{\"ph\":\"M\",\"pid\":{pid},\"tid\":0,\"name\":\"process_sort_index\",\"args\":{{\"sort_index\":{pid}}}}}"
            );
            w.event(&e)?;
        }
        for i in 0..tracks.len() {
            let tid = i as u64 + 1;
            w.state[i].sort_base = (i as u64) * 1024;
            w.state[i].lanes.push(Lane { tid, ..Lane::default() });
            w.lane_metadata(i, 0)?;
        }
        Ok(w)
    }

    fn event(&mut self, json: &str) -> io::Result<()> {
        if self.first_event {
            self.first_event = false;
            self.out.write_all(b"\n")?;
        } else {
            self.out.write_all(b",\n")?;
        }
        self.out.write_all(json.as_bytes())
    }

    fn lane_metadata(&mut self, track: usize, lane: usize) -> io::Result<()> {
        let st = &self.state[track];
        let (pid, tid, sort) = (st.pid, st.lanes[lane].tid, st.sort_base + lane as u64);
        let mut name = self.tracks[track].name.clone();
        if lane > 0 {
            name.push_str(&format!(" #{}", lane + 1));
        }
        let mut e = format!(
            "{{\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"name\":\"thread_name\",\"args\":{{\"name\":"
        );
        push_json_str(&mut e, &name);
        e.push_str("}}");
        self.event(&e)?;
        let e = format!(
            "{{\"ph\":\"M\",\"pid\":{pid},\"tid\":{tid},\"name\":\"thread_sort_index\",\"args\":{{\"sort_index\":{sort}}}}}"
        );
        self.event(&e)
    }

    /// Picks the lane of `track` where `[start, end)` nests properly: on a lane, slices
    /// arrive in start order and each either starts after the open ones end or lies inside
    /// the innermost open one. Opens a new lane when none fits.
    fn lane_for(&mut self, track: usize, start: u64, end: u64) -> io::Result<u64> {
        let lanes = &mut self.state[track].lanes;
        for lane in lanes.iter_mut() {
            if start < lane.last_start {
                continue;
            }
            while lane.open_ends.last().is_some_and(|&e| e <= start) {
                lane.open_ends.pop();
            }
            if lane.open_ends.last().is_none_or(|&e| e >= end) {
                lane.open_ends.push(end);
                lane.last_start = start;
                return Ok(lane.tid);
            }
        }
        let tid = self.next_tid;
        self.next_tid += 1;
        let lanes = &mut self.state[track].lanes;
        lanes.push(Lane { tid, last_start: start, open_ends: vec![end] });
        let lane = lanes.len() - 1;
        self.lane_metadata(track, lane)?;
        Ok(tid)
    }

    /// Writes one complete event. Feed the slices of a track in start order (ties: longest
    /// first), as [`write_trace`] does; a slice that starts before the previous one on its
    /// lane, or overlaps it without nesting, goes to another lane of the track.
    pub fn slice(
        &mut self,
        track: usize,
        name: &str,
        category: &str,
        start: SimTime,
        duration: SimTime,
        args: &[(&str, &str)],
    ) -> Result<(), TraceError> {
        if track >= self.tracks.len() {
            return Err(TraceError::BadTrack { name: name.to_string(), track, tracks: self.tracks.len() });
        }
        let end = start.ps().saturating_add(duration.ps());
        let tid = self.lane_for(track, start.ps(), end)?;
        let pid = self.state[track].pid;
        let mut e = String::with_capacity(128);
        e.push_str("{\"ph\":\"X\",\"pid\":");
        e.push_str(&pid.to_string());
        e.push_str(",\"tid\":");
        e.push_str(&tid.to_string());
        e.push_str(",\"ts\":");
        push_us(&mut e, start.ps());
        e.push_str(",\"dur\":");
        push_us(&mut e, duration.ps());
        e.push_str(",\"name\":");
        push_json_str(&mut e, name);
        e.push_str(",\"cat\":");
        push_json_str(&mut e, category);
        if !args.is_empty() {
            e.push_str(",\"args\":{");
            for (k, (key, value)) in args.iter().enumerate() {
                if k > 0 {
                    e.push(',');
                }
                push_json_str(&mut e, key);
                e.push(':');
                push_json_str(&mut e, value);
            }
            e.push('}');
        }
        e.push('}');
        self.event(&e)?;
        self.slices += 1;
        Ok(())
    }

    /// Writes a [`Slice`].
    pub fn write(&mut self, s: &Slice) -> Result<(), TraceError> {
        let args: Vec<(&str, &str)> = s.args.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.slice(s.track, &s.name, &s.category, s.start, s.duration, &args)
    }

    /// Slices written so far.
    pub fn slice_count(&self) -> u64 {
        self.slices
    }

    /// Closes the JSON, flushes, and returns the underlying writer.
    pub fn finish(mut self) -> Result<W, TraceError> {
        self.out.write_all(b"\n]}\n")?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Writes a whole trace to `path`: slices are sorted by (start, track, longest first) so
/// that enclosing slices precede the ones they contain, then streamed.
pub fn write_trace(path: &Path, tracks: &[Track], slices: &[Slice]) -> Result<(), TraceError> {
    let with_path = |e: TraceError| match e {
        TraceError::Io { path: None, source } => TraceError::Io { path: Some(path.to_path_buf()), source },
        other => other,
    };
    let file = std::fs::File::create(path)
        .map_err(|source| TraceError::Io { path: Some(path.to_path_buf()), source })?;
    let mut order: Vec<usize> = (0..slices.len()).collect();
    order.sort_by_key(|&i| {
        let s = &slices[i];
        (s.start, s.track, std::cmp::Reverse(s.duration))
    });
    let mut w = TraceWriter::new(BufWriter::new(file), tracks).map_err(with_path)?;
    for i in order {
        w.write(&slices[i]).map_err(with_path)?;
    }
    w.finish().map_err(with_path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(v: u64) -> SimTime {
        SimTime::from_ns(v * 1000)
    }

    #[test]
    fn microseconds_keep_picoseconds() {
        let mut s = String::new();
        push_us(&mut s, 1_500_000);
        s.push(' ');
        push_us(&mut s, 1);
        s.push(' ');
        push_us(&mut s, 3_000_000);
        assert_eq!(s, "1.5 0.000001 3");
    }

    #[test]
    fn strings_are_escaped() {
        let mut s = String::new();
        push_json_str(&mut s, "a\"b\\c\nd\u{1}é");
        let back: String = serde_json::from_str(&s).unwrap();
        assert_eq!(back, "a\"b\\c\nd\u{1}é");
    }

    #[test]
    fn overlapping_slices_get_extra_lanes_and_nested_ones_do_not() {
        let tracks = [Track::new("link", TrackKind::Link)];
        let mut w = TraceWriter::new(Vec::new(), &tracks).unwrap();
        w.slice(0, "outer", "c", us(0), us(10), &[]).unwrap();
        w.slice(0, "inner", "c", us(2), us(3), &[]).unwrap();
        w.slice(0, "overlap", "c", us(8), us(5), &[]).unwrap();
        w.slice(0, "later", "c", us(20), us(1), &[]).unwrap();
        let out = String::from_utf8(w.finish().unwrap()).unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let ev = v["traceEvents"].as_array().unwrap();
        let tid_of = |n: &str| ev.iter().find(|e| e["name"] == n).unwrap()["tid"].as_u64().unwrap();
        assert_eq!(tid_of("outer"), 1);
        assert_eq!(tid_of("inner"), 1);
        assert_eq!(tid_of("overlap"), 2);
        assert_eq!(tid_of("later"), 1);
        assert!(ev.iter().any(|e| e["ph"] == "M" && e["args"]["name"] == "link #2"));
    }

    #[test]
    fn bad_track_is_an_error() {
        let mut w = TraceWriter::new(Vec::new(), &[]).unwrap();
        let e = w.slice(3, "x", "c", us(0), us(1), &[]).unwrap_err();
        assert!(e.to_string().contains("only 0 tracks"), "{e}");
    }
}
