//! `specstate._native.ChatTemplate`: llama.cpp's chat templates over a model.

use std::sync::Arc;

use pyo3::prelude::*;

use super::arguments::WideInt;
use super::model::PyModel;
use crate::chat::{self, Message};
use crate::native::{ChatTemplates, Model};

/// Messages as `(role, content)` pairs, the way Python hands them over.
pub(crate) type Pairs = Vec<(String, String)>;

pub(crate) fn messages(pairs: Pairs) -> Vec<Message> {
    pairs
        .into_iter()
        .map(|(role, content)| Message::new(role, content))
        .collect()
}

pub(crate) fn pairs(messages: &[Message]) -> Pairs {
    messages
        .iter()
        .map(|m| (m.role.clone(), m.content.clone()))
        .collect()
}

/// A model's chat template (or one given in its place), rendered by llama.cpp.
#[pyclass(name = "ChatTemplate", module = "specstate._native", frozen)]
pub(crate) struct PyChatTemplate {
    templates: ChatTemplates,
    model: Arc<Model>,
    /// The Jinja source in use.
    #[pyo3(get)]
    source: String,
}

#[pymethods]
impl PyChatTemplate {
    #[new]
    #[pyo3(signature = (model, source = None))]
    fn new(model: &PyModel, source: Option<&str>) -> PyResult<Self> {
        let templates = ChatTemplates::new(&model.inner, source)
            .map_err(|e| chat::ChatError::Template(e.to_string()))?;
        Ok(Self {
            source: templates.source()?,
            templates,
            model: Arc::clone(&model.inner),
        })
    }

    /// The conversation as text.
    #[pyo3(signature = (messages, *, add_generation_prompt = true))]
    fn render(
        &self,
        py: Python<'_>,
        messages: Pairs,
        add_generation_prompt: bool,
    ) -> PyResult<String> {
        let messages = self::messages(messages);
        Ok(py.detach(|| chat::render_text(&self.templates, &messages, add_generation_prompt))?)
    }

    /// The first turn's prompt tokens.
    fn prompt_tokens(&self, py: Python<'_>, messages: Pairs) -> PyResult<Vec<i32>> {
        let messages = self::messages(messages);
        Ok(py.detach(|| chat::prompt_tokens(&self.model, &self.templates, &messages))?)
    }

    /// The tokens of a next turn after a reply ending with `last_token`.
    fn next_turn_tokens(
        &self,
        py: Python<'_>,
        before: Pairs,
        last_token: WideInt,
        new: Pairs,
    ) -> PyResult<Vec<i32>> {
        let last_token: i32 = last_token.narrow("last_token")?;
        let (before, new) = (messages(before), messages(new));
        Ok(py.detach(|| {
            chat::next_turn_tokens(&self.model, &self.templates, &before, last_token, &new)
        })?)
    }
}
