//! Unit tests of `named.rs`'s split of a built-in template's text.

use super::named::split;
use super::Message;

fn messages(contents: &[&str]) -> Vec<Message> {
    contents.iter().map(|c| Message::new("user", *c)).collect()
}

#[test]
fn the_template_text_and_each_message_apart() {
    let m = messages(&["Hi", "  there "]);
    let skeleton = "<u>\u{1}specstate:message:0\u{1}</u><u>\u{1}specstate:message:1\u{1}</u>";
    let parts = split("<u>Hi</u><u>there</u>", skeleton, &m).expect("splits");
    let texts: Vec<(&str, bool)> = parts
        .iter()
        .map(|p| (p.text.as_str(), p.is_input))
        .collect();
    assert_eq!(
        texts,
        [
            ("<u>", false),
            ("Hi", true),
            ("</u><u>", false),
            ("there", true),
            ("</u>", false)
        ]
    );
}

#[test]
fn a_message_given_trimmed_or_not_is_found_by_backtracking() {
    // "a " could be read as given ("a ") or trimmed ("a"); only "a" lets the rest match.
    let m = messages(&["a ", " b"]);
    let skeleton = "\u{1}specstate:message:0\u{1}\u{1}specstate:message:1\u{1}";
    let parts = split("a b", skeleton, &m).expect("splits");
    let texts: Vec<&str> = parts.iter().map(|p| p.text.as_str()).collect();
    assert_eq!(texts.concat(), "a b");
    assert!(parts.iter().all(|p| p.is_input));
}

#[test]
fn text_that_is_not_the_skeleton_filled_in_is_refused() {
    let m = messages(&["Hi"]);
    let skeleton = "<u>\u{1}specstate:message:0\u{1}</u>";
    assert!(split("<u>Hello</u>", skeleton, &m).is_none());
    assert!(split("<u>Hi</u>!", skeleton, &m).is_none());
}

#[test]
fn a_marker_like_text_out_of_range_stays_template_text() {
    let m = messages(&["x"]);
    let skeleton = "\u{1}specstate:message:7\u{1}|\u{1}specstate:message:0\u{1}";
    let parts = split("\u{1}specstate:message:7\u{1}|x", skeleton, &m).expect("splits");
    assert_eq!(parts.iter().filter(|p| p.is_input).count(), 1);
    assert_eq!(
        parts.iter().map(|p| p.text.as_str()).collect::<String>(),
        "\u{1}specstate:message:7\u{1}|x"
    );
}
