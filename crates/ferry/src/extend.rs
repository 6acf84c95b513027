//! The extension point through which a primitive plugs into the core:
//! *served frames*. A primitive takes a range of frame kinds
//! ([`SERVED_KINDS`]), registers a [`FrameHandler`] for it
//! ([`Team::serve_frames`](crate::Team::serve_frames)), and its peers send
//! it frames with a [`RawSender`](crate::RawSender) made by
//! [`Team::frame_sender`](crate::Team::frame_sender). The handler runs in
//! the receiving team's progress loop (whichever thread drains the channel,
//! never a user task) and answers through the [`ServedFrame`]. A routed
//! primitive (links, groups) starts its frames' payloads with a [`Route`].
//!
//! A primitive keeps its own state per team in a [`PerTeam`]: made on the
//! team's first use and registered as its handler, found again by team id
//! (how a user in another team of the process reaches it directly).
//!
//! *Resources after the bind*: over shared memory, an answer can hand the
//! caller descriptors (memfds: segments it maps) —
//! [`ServedFrame::reply_with_descriptors`] answers
//! [`RawSender::call_for_descriptors`](crate::RawSender::call_for_descriptors).
//! A caller gets descriptors only in the answer to a call that asked for
//! them; anything else a peer sends is a protocol violation (`docs/WIRE.md`).
//!
//! ```
//! use ferry::extend::{FrameHandler, ServedFrame};
//! use ferry::{Checkpoint, Team};
//! use std::sync::Arc;
//!
//! /// Answers a frame of kind 200 with its bytes reversed.
//! struct Reverse;
//!
//! impl FrameHandler for Reverse {
//!     fn serve(&self, frame: ServedFrame<'_>) {
//!         let reversed: Vec<u8> = frame.with_payload(|b| b.iter().rev().copied().collect());
//!         let _ = frame.reply(&reversed);
//!     }
//! }
//!
//! # let dir = tempfile::tempdir().unwrap();
//! let owner = Team::builder().runtime_dir(dir.path()).start()?;
//! let _serving = owner.serve_frames(200..=200, Arc::new(Reverse))?;
//! let user = Team::builder().runtime_dir(dir.path()).start()?;
//! let sender = user.frame_sender(owner.id().endpoint(0).unwrap(), 200)?;
//! assert_eq!(sender.send(b"abc", Checkpoint::OnReturn)?, b"cba");
//! # Ok::<(), ferry::Error>(())
//! ```

pub use crate::runtime::per_team::PerTeam;
pub use crate::runtime::served::{FrameHandler, Opening, PeerLiveness, ServedFrame, ServedKinds};
pub use crate::wire::{Route, SERVED_KINDS};
