use crate::Case;
pub fn cases() -> Vec<Case> {
    Vec::new()
}
