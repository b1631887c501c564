//! Messages written once: a layer's `MESSAGES` table pairs each variant's
//! name with its template, where `{name}` stands for the field `name` (as in
//! Python's `str.format`). `Display` fills the templates in here, and the
//! Python exceptions read the same tables from `specstate._native`.

/// The template of `variant` in `messages` (empty if it has none).
pub(crate) fn template(messages: &[(&'static str, &'static str)], variant: &str) -> &'static str {
    messages
        .iter()
        .find(|(name, _)| *name == variant)
        .map_or("", |(_, template)| template)
}

/// `template` with each `{name}` replaced by the value of the field `name`,
/// in one pass (as `str.format` does: a value's own braces stay as they are).
pub(crate) fn fill(template: &str, fields: &[(&str, &dyn std::fmt::Display)]) -> String {
    let mut text = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let field = after.find('}').and_then(|close| {
            let value = fields.iter().find(|(name, _)| *name == &after[..close]);
            value.map(|(_, value)| (close, value))
        });
        match field {
            Some((close, value)) => {
                text.push_str(&value.to_string());
                rest = &after[close + 1..];
            }
            None => {
                text.push('{');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    text
}
