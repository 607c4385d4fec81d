//! The message templates of rules/messages.yaml, compiled once and filled strictly: every host
//! that turns a rule's template name into a sentence (the planner, the hand-over, the admission
//! review) fills it here, so a template that names a value its host does not give is an error
//! the tests catch, never a sentence with a hole.
//!
//! Start at `Messages::load` and `Messages::render`.

use handlebars::Handlebars;
use serde_json::Value as Json;

/// Why the templates do not load or a template does not fill.
#[derive(Debug, thiserror::Error)]
pub enum MessageError {
    #[error("{file} is not a map of template names to templates")]
    File {
        file: String,
        #[source]
        source: serde_yaml::Error,
    },
    #[error("{file}: template {name} does not compile")]
    Template {
        file: String,
        name: String,
        #[source]
        source: Box<handlebars::TemplateError>,
    },
    #[error("template {name} does not fill from what its host gives")]
    Render {
        name: String,
        #[source]
        source: Box<handlebars::RenderError>,
    },
}

/// Every template, compiled strictly (a missing value is an error) and without HTML escaping.
pub struct Messages {
    hb: Handlebars<'static>,
}

impl std::fmt::Debug for Messages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Messages").field("templates", &self.hb.get_templates().len()).finish()
    }
}

impl Messages {
    /// Compiles the templates of `(file, text)`, as `render::embedded::MESSAGES` holds them.
    pub fn load((file, text): (&str, &str)) -> Result<Messages, MessageError> {
        let templates: std::collections::BTreeMap<String, String> =
            serde_yaml::from_str(text).map_err(|source| MessageError::File { file: file.to_string(), source })?;
        let mut hb = Handlebars::new();
        hb.set_strict_mode(true);
        hb.register_escape_fn(handlebars::no_escape);
        for (name, t) in &templates {
            hb.register_template_string(name, t).map_err(|source| MessageError::Template {
                file: file.to_string(),
                name: name.clone(),
                source: Box::new(source),
            })?;
        }
        Ok(Messages { hb })
    }

    /// The shipped templates.
    pub fn embedded() -> Result<Messages, MessageError> {
        Messages::load(render::embedded::MESSAGES)
    }

    /// Whether a template of this name exists.
    pub fn has(&self, name: &str) -> bool {
        self.hb.has_template(name)
    }

    /// Template `name` filled from `data`.
    pub fn render(&self, name: &str, data: &Json) -> Result<String, MessageError> {
        self.hb
            .render(name, data)
            .map_err(|source| MessageError::Render { name: name.to_string(), source: Box::new(source) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_missing_a_value_is_an_error_not_a_hole() {
        let m = Messages::load(("m.yaml", "Hello: \"hello {{who}}\"\n")).unwrap();
        assert_eq!(m.render("Hello", &serde_json::json!({"who": "<you>"})).unwrap(), "hello <you>");
        let e = m.render("Hello", &serde_json::json!({})).unwrap_err();
        assert!(matches!(e, MessageError::Render { ref name, .. } if name == "Hello"), "{e:?}");
        assert!(Messages::load(("m.yaml", "Bad: \"{{#if}}\"\n")).is_err());
    }
}
