//! "Did you mean": the known word nearest to a misspelt one.

/// The candidate nearest to `word`, if within two edits (a typo, not a different word).
pub(crate) fn closest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|known| (edit_distance(word, known), known))
        .filter(|(distance, _)| *distance <= 2)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, known)| known)
}

/// Levenshtein distance over chars, one row at a time.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("tenat", "tenant"), 1);
    }

    #[test]
    fn nearest_within_two_edits() {
        let words = ["tenant", "year", "id"];
        assert_eq!(closest("tenat", words), Some("tenant"));
        assert_eq!(closest("yaer", words), Some("year"));
        assert_eq!(closest("ids", words), Some("id"));
        assert_eq!(closest("customer", words), None);
        assert_eq!(closest("x", []), None);
    }
}
