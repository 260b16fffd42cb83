//! Typed indices into a [`super::Plan`], and vectors indexed by them.
//!
//! A plan's stages and PCollections are numbered by their place in its two
//! tables, and the engine keeps its run-time state in vectors parallel to
//! them. While both numbers were bare `usize`s, a PCollection's number (or
//! any count) could index the stages and nothing would notice.
//! [`StageIdx`] and [`PCollectionIdx`] are distinct types, and a
//! [`TypedVec`] is indexed only by its own kind of index: a [`StageVec`]
//! by a [`StageIdx`], a [`PCollectionVec`] by a [`PCollectionIdx`].

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Index, IndexMut};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A kind of index into one kind of table: what a [`TypedVec`] needs of
/// the indices it takes.
pub trait TypedIndex: Copy {
    /// The index of position `index`.
    fn from_index(index: usize) -> Self;
    /// The position it stands for.
    fn index(self) -> usize;
}

/// Defines an index type: a `usize` that only its own tables take. Written
/// out once, so that both kinds of index behave exactly alike.
macro_rules! typed_index {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        ///
        /// Serialized as the bare number (`serde(transparent)`), and
        /// displayed as it: checkpoint part names (`stage/{i}`), bundle
        /// descriptor ids and the UI's JSON keep the numbers they had
        /// when indices were `usize`s.
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(usize);

        impl $name {
            /// The index of position `index` in its table.
            pub const fn new(index: usize) -> Self {
                $name(index)
            }

            /// The position it stands for in its table (to index a
            /// plain slice, or to write the number in a key).
            pub const fn index(self) -> usize {
                self.0
            }
        }

        impl TypedIndex for $name {
            fn from_index(index: usize) -> Self {
                $name(index)
            }

            fn index(self) -> usize {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }
    };
}

typed_index! {
    /// Index of a stage in [`super::Plan::stages`].
    StageIdx
}

typed_index! {
    /// Index of a PCollection in [`super::Plan::pcollections`].
    PCollectionIdx
}

/// A transform's id as the pipeline names it, interned: translation makes
/// one per transform, and the plan's timer families, window expirations
/// and side inputs, and the timers the engine keeps and fires, share it
/// (a clone is a reference count, not a copy of the string). It reads as
/// the `str` it stands for, and checkpoints encode it as one.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TransformId(Arc<str>);

impl TransformId {
    /// The id `id` (translation makes one per transform, then clones it).
    pub fn new(id: &str) -> Self {
        TransformId(Arc::from(id))
    }

    /// The id as the pipeline spells it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for TransformId {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<&str> for TransformId {
    fn from(id: &str) -> Self {
        TransformId::new(id)
    }
}

impl From<String> for TransformId {
    fn from(id: String) -> Self {
        TransformId(Arc::from(id))
    }
}

impl PartialEq<str> for TransformId {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<String> for TransformId {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl fmt::Display for TransformId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TransformId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl Serialize for TransformId {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for TransformId {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(TransformId::from)
    }
}

/// A vector that only `I` indexes: the table of a plan's stages or
/// PCollections, or what the engine keeps per stage or per PCollection.
/// Plain `usize`s do not index it; [`Self::iter_enumerated`] and
/// [`Self::indices`] give typed indices where a loop needs them.
pub struct TypedVec<I, T> {
    items: Vec<T>,
    index: PhantomData<fn(I) -> I>,
}

/// What a plan or the engine keeps per stage.
pub type StageVec<T> = TypedVec<StageIdx, T>;

/// What a plan or the engine keeps per PCollection.
pub type PCollectionVec<T> = TypedVec<PCollectionIdx, T>;

impl<I: TypedIndex, T> TypedVec<I, T> {
    /// An empty vector.
    pub fn new() -> Self {
        Self::from(Vec::new())
    }

    /// How many items it holds.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Adds `item` at the end; returns its index.
    pub fn push(&mut self, item: T) -> I {
        let at = I::from_index(self.items.len());
        self.items.push(item);
        at
    }

    /// The item at `index`, if there is one.
    pub fn get(&self, index: I) -> Option<&T> {
        self.items.get(index.index())
    }

    /// The item at `index`, mutably, if there is one.
    pub fn get_mut(&mut self, index: I) -> Option<&mut T> {
        self.items.get_mut(index.index())
    }

    /// The items in index order.
    pub fn iter(&self) -> std::slice::Iter<'_, T> {
        self.items.iter()
    }

    /// Every index, in order.
    pub fn indices(&self) -> impl DoubleEndedIterator<Item = I> + ExactSizeIterator {
        (0..self.items.len()).map(I::from_index)
    }

    /// The items with their indices, in order.
    pub fn iter_enumerated(&self) -> impl DoubleEndedIterator<Item = (I, &T)> + ExactSizeIterator {
        self.items
            .iter()
            .enumerate()
            .map(|(at, item)| (I::from_index(at), item))
    }

    /// The items with their indices, in order, mutably.
    pub fn iter_enumerated_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = (I, &mut T)> + ExactSizeIterator {
        self.items
            .iter_mut()
            .enumerate()
            .map(|(at, item)| (I::from_index(at), item))
    }
}

impl<I, T> From<Vec<T>> for TypedVec<I, T> {
    /// The vector whose item at index `i` is `items[i]`.
    fn from(items: Vec<T>) -> Self {
        TypedVec {
            items,
            index: PhantomData,
        }
    }
}

impl<I, T> FromIterator<T> for TypedVec<I, T> {
    fn from_iter<It: IntoIterator<Item = T>>(items: It) -> Self {
        Self::from(items.into_iter().collect::<Vec<T>>())
    }
}

impl<I: TypedIndex, T> Index<I> for TypedVec<I, T> {
    type Output = T;

    fn index(&self, index: I) -> &T {
        &self.items[index.index()]
    }
}

impl<I: TypedIndex, T> IndexMut<I> for TypedVec<I, T> {
    fn index_mut(&mut self, index: I) -> &mut T {
        &mut self.items[index.index()]
    }
}

impl<I, T> IntoIterator for TypedVec<I, T> {
    type Item = T;
    type IntoIter = std::vec::IntoIter<T>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter()
    }
}

impl<'a, I, T> IntoIterator for &'a TypedVec<I, T> {
    type Item = &'a T;
    type IntoIter = std::slice::Iter<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.iter()
    }
}

impl<'a, I, T> IntoIterator for &'a mut TypedVec<I, T> {
    type Item = &'a mut T;
    type IntoIter = std::slice::IterMut<'a, T>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.iter_mut()
    }
}

impl<I, T> Default for TypedVec<I, T> {
    fn default() -> Self {
        Self::from(Vec::new())
    }
}

impl<I, T: Clone> Clone for TypedVec<I, T> {
    fn clone(&self) -> Self {
        Self::from(self.items.clone())
    }
}

impl<I, T: PartialEq> PartialEq for TypedVec<I, T> {
    fn eq(&self, other: &Self) -> bool {
        self.items == other.items
    }
}

impl<I, T: Eq> Eq for TypedVec<I, T> {}

/// As the plain vector: a plan prints as it did when its tables were
/// `Vec`s.
impl<I, T: fmt::Debug> fmt::Debug for TypedVec<I, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.items.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typed_vector_is_indexed_by_its_own_kind_of_index() {
        let mut stages: StageVec<&str> = StageVec::new();
        let impulse = stages.push("impulse");
        let sink = stages.push("sink");
        assert_eq!((impulse, sink), (StageIdx::new(0), StageIdx::new(1)));
        assert_eq!(stages[sink], "sink");
        stages[sink] = "write";
        assert_eq!(stages.get(StageIdx::new(2)), None);
        let seen: Vec<_> = stages.iter_enumerated().collect();
        assert_eq!(seen, [(impulse, &"impulse"), (sink, &"write")]);
        assert_eq!(stages.indices().rev().collect::<Vec<_>>(), [sink, impulse]);
        let outputs = PCollectionVec::from(vec!["a", "b", "c"]);
        assert_eq!(outputs[PCollectionIdx::new(2)], "c");
    }

    #[test]
    fn indices_print_and_serialize_as_their_number() {
        let stage = StageIdx::new(7);
        assert_eq!(format!("stage/{stage}"), "stage/7");
        assert_eq!(serde_json::to_string(&[stage]).ok().as_deref(), Some("[7]"));
        let usize_bytes = postcard::to_stdvec(&7usize).ok();
        assert_eq!(postcard::to_stdvec(&stage).ok(), usize_bytes);
        let read: Option<PCollectionIdx> = postcard::from_bytes(&[7]).ok();
        assert_eq!(read, Some(PCollectionIdx::new(7)));
    }
}
