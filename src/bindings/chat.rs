//! `specstate._native.ChatTemplate`: llama.cpp's chat templates over a model,
//! and `ToolRender`, a conversation rendered with tools.

use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::arguments::WideInt;
use super::model::PyModel;
use crate::chat::{self, Message, ToolTurn};
use crate::native::{
    builtin_template_names, ChatTemplates, Model, ToolChoice, ToolRender, ToolRequest,
    MAX_RENDERED_BYTES,
};

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

fn template_error(error: impl ToString) -> PyErr {
    chat::ChatError::Template(error.to_string()).into()
}

/// A model's chat template (or one given in its place), rendered by llama.cpp.
#[pyclass(name = "ChatTemplate", module = "specstate._native", frozen)]
pub(crate) struct PyChatTemplate {
    templates: ChatTemplates,
    model: Arc<Model>,
    /// The Jinja source in use (a built-in template's name).
    #[pyo3(get)]
    source: String,
    /// The name of llama.cpp's built-in template in use, or None for Jinja.
    #[pyo3(get)]
    name: Option<String>,
}

#[pymethods]
impl PyChatTemplate {
    #[new]
    #[pyo3(signature = (model, source = None, *, name = None))]
    fn new(
        py: Python<'_>,
        model: &PyModel,
        source: Option<&str>,
        name: Option<&str>,
    ) -> PyResult<Self> {
        if source.is_some() && name.is_some() {
            return Err(PyValueError::new_err("give source or name, not both"));
        }
        let native = Arc::clone(&model.inner);
        // The setup renders a Jinja template (bounded by patch 0010): other Python threads go on meanwhile.
        let templates = py
            .detach(|| match name {
                None => ChatTemplates::new(&native, source),
                Some(name) => ChatTemplates::builtin(&native, name),
            })
            .map_err(template_error)?;
        Ok(Self {
            source: templates.source()?,
            name: templates.builtin_name().map(str::to_owned),
            templates,
            model: Arc::clone(&model.inner),
        })
    }

    /// The names of llama.cpp's built-in templates (`llama_chat_builtin_templates`).
    #[staticmethod]
    fn builtin_names() -> Vec<String> {
        builtin_template_names()
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

    /// The conversation rendered with tools, as llama.cpp's server renders it.
    #[pyo3(signature = (
        messages_json, tools_json = None, *, tool_choice = "auto", parallel_tool_calls = false,
        add_generation_prompt = true
    ))]
    fn render_tools(
        &self,
        py: Python<'_>,
        messages_json: &str,
        tools_json: Option<&str>,
        tool_choice: &str,
        parallel_tool_calls: bool,
        add_generation_prompt: bool,
    ) -> PyResult<PyToolRender> {
        let tool_choice = match tool_choice {
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            "none" => ToolChoice::None,
            other => {
                return Err(PyValueError::new_err(format!(
                    "tool_choice must be 'auto', 'required' or 'none', not {other:?}"
                )));
            }
        };
        for (what, text) in [
            ("messages_json", Some(messages_json)),
            ("tools_json", tools_json),
        ] {
            let len = text.map_or(0, str::len);
            if len > MAX_RENDERED_BYTES {
                return Err(PyValueError::new_err(format!(
                    "{what} is {len} bytes (at most {MAX_RENDERED_BYTES})"
                )));
            }
        }
        let request = ToolRequest {
            messages_json,
            tools_json,
            tool_choice,
            parallel_tool_calls,
            add_generation_prompt,
        };
        let render = py
            .detach(|| self.templates.apply_tools(&request))
            .map_err(template_error)?;
        Ok(PyToolRender {
            text: render.parts.iter().map(|part| part.text.as_str()).collect(),
            render,
            model: Arc::clone(&self.model),
        })
    }

    /// The tokens of a next turn of a conversation with tools, after a reply
    /// ending with `last_token` (the reply stays as the model wrote it).
    #[pyo3(signature = (
        before_json, last_token, new_json, tools_json = None, *, tool_choice = "auto",
        parallel_tool_calls = false
    ))]
    #[allow(clippy::too_many_arguments)]
    fn tool_next_turn_tokens(
        &self,
        py: Python<'_>,
        before_json: &str,
        last_token: WideInt,
        new_json: &str,
        tools_json: Option<&str>,
        tool_choice: &str,
        parallel_tool_calls: bool,
    ) -> PyResult<Vec<i32>> {
        let last_token: i32 = last_token.narrow("last_token")?;
        let tools = ToolTurn {
            tools_json,
            tool_choice: self::tool_choice(tool_choice)?,
            parallel_tool_calls,
        };
        check_json_sizes(&[
            ("before_json", Some(before_json)),
            ("new_json", Some(new_json)),
            ("tools_json", tools_json),
        ])?;
        Ok(py.detach(|| {
            chat::tool_next_turn_tokens(
                &self.model,
                &self.templates,
                before_json,
                last_token,
                new_json,
                tools,
            )
        })?)
    }
}

fn tool_choice(choice: &str) -> PyResult<ToolChoice> {
    match choice {
        "auto" => Ok(ToolChoice::Auto),
        "required" => Ok(ToolChoice::Required),
        "none" => Ok(ToolChoice::None),
        other => Err(PyValueError::new_err(format!(
            "tool_choice must be 'auto', 'required' or 'none', not {other:?}"
        ))),
    }
}

/// JSON arguments are bounded as rendered prompts are.
fn check_json_sizes(texts: &[(&str, Option<&str>)]) -> PyResult<()> {
    for (what, text) in texts {
        let len = text.map_or(0, str::len);
        if len > MAX_RENDERED_BYTES {
            return Err(PyValueError::new_err(format!(
                "{what} is {len} bytes (at most {MAX_RENDERED_BYTES})"
            )));
        }
    }
    Ok(())
}

/// A conversation rendered with tools by a Jinja chat template, and
/// llama.cpp's parser of its replies.
#[pyclass(name = "ToolRender", module = "specstate._native", frozen)]
pub(crate) struct PyToolRender {
    render: ToolRender,
    model: Arc<Model>,
    /// The prompt's text.
    #[pyo3(get)]
    text: String,
}

#[pymethods]
impl PyToolRender {
    /// llama.cpp's chat format number (`common_chat_format`).
    #[getter]
    fn format(&self) -> i32 {
        self.render.format
    }

    /// llama.cpp's name of the chat format.
    #[getter]
    fn format_name(&self) -> &str {
        &self.render.format_name
    }

    /// llama.cpp's grammar for the reply ("" for none).
    #[getter]
    fn grammar(&self) -> &str {
        &self.render.grammar
    }

    /// Whether the grammar applies only once a trigger is seen.
    #[getter]
    fn grammar_lazy(&self) -> bool {
        self.render.grammar_lazy
    }

    /// The lazy grammar's triggers: `(type, value, token)`.
    #[getter]
    fn grammar_triggers(&self) -> Vec<(String, String, i64)> {
        self.render
            .grammar_triggers
            .iter()
            .map(|t| (t.kind.clone(), t.value.clone(), t.token))
            .collect()
    }

    /// Texts to keep as single tokens.
    #[getter]
    fn preserved_tokens(&self) -> Vec<String> {
        self.render.preserved_tokens.clone()
    }

    /// More stop strings.
    #[getter]
    fn additional_stops(&self) -> Vec<String> {
        self.render.additional_stops.clone()
    }

    /// What llama.cpp's parser sees before the reply.
    #[getter]
    fn generation_prompt(&self) -> &str {
        &self.render.generation_prompt
    }

    /// The prompt's tokens: BOS if the model adds one, template text with
    /// special tokens parsed, message text literally.
    fn prompt_tokens(&self, py: Python<'_>) -> PyResult<Vec<i32>> {
        Ok(py.detach(|| chat::parts_tokens(&self.model, &self.render.parts))?)
    }

    /// llama.cpp's reading of a reply: an OpenAI-shaped JSON message.
    #[pyo3(signature = (text, *, partial = false))]
    fn parse(&self, py: Python<'_>, text: &str, partial: bool) -> PyResult<String> {
        py.detach(|| self.render.parse(text, partial))
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }
}
