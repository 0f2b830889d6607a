//! The live terminal view (ratatui). Keys: `q` quit, arrows / `j` `k` select, `p` pause,
//! `/` filter (Enter applies, Esc clears), `?` help. The terminal is restored on every exit,
//! panics included.

use std::time::Instant;

use crossterm::event::{self, Event, KeyCode, KeyEventKind};
use probe_contract::Message;
use ratatui::{
    DefaultTerminal, Frame,
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Borders, Clear, List, ListItem, Paragraph, Row as TRow, Table, Wrap},
};
use tokio::{
    io::{BufReader, Lines},
    net::UnixStream,
    sync::mpsc,
};

use super::view::Model;

/// Keyboard input mode.
#[derive(Default, PartialEq)]
enum Input {
    #[default]
    Normal,
    Filter(String),
}

pub async fn run(mut lines: Lines<BufReader<UnixStream>>) -> anyhow::Result<()> {
    // ratatui::init installs a panic hook that restores the terminal.
    let mut terminal = ratatui::init();
    let result = run_loop(&mut terminal, &mut lines).await;
    ratatui::restore();
    result
}

async fn run_loop(
    terminal: &mut DefaultTerminal,
    lines: &mut Lines<BufReader<UnixStream>>,
) -> anyhow::Result<()> {
    let (key_tx, mut keys) = mpsc::channel(64);
    std::thread::spawn(move || {
        while let Ok(ev) = event::read() {
            if key_tx.blocking_send(ev).is_err() {
                break;
            }
        }
    });
    let start = Instant::now();
    let mut model = Model::default();
    let mut input = Input::Normal;
    loop {
        terminal.draw(|f| draw(f, &model, &input))?;
        tokio::select! {
            line = lines.next_line() => {
                let Some(line) = line? else {
                    anyhow::bail!("the agent closed the connection");
                };
                if model.paused {
                    continue;
                }
                match serde_json::from_str(&line)? {
                    Message::Snapshot { snapshot } => model.apply_snapshot(&snapshot, start.elapsed().as_secs_f64()),
                    Message::Report { event, is_new } => model.apply_report(&event, is_new),
                }
            }
            Some(ev) = keys.recv() => {
                let Event::Key(key) = ev else { continue };
                if key.kind != KeyEventKind::Press {
                    continue;
                }
                match &mut input {
                    Input::Filter(text) => match key.code {
                        KeyCode::Enter => {
                            model.filter = std::mem::take(text);
                            model.selected = 0;
                            input = Input::Normal;
                        }
                        KeyCode::Esc => {
                            model.filter.clear();
                            input = Input::Normal;
                        }
                        KeyCode::Backspace => { text.pop(); }
                        KeyCode::Char(c) => text.push(c),
                        _ => {}
                    },
                    Input::Normal => match key.code {
                        KeyCode::Char('q') => return Ok(()),
                        // Raw mode turns Ctrl-C into a key, not a signal.
                        KeyCode::Char('c') if key.modifiers.contains(event::KeyModifiers::CONTROL) => return Ok(()),
                        KeyCode::Down | KeyCode::Char('j') => model.select_next(),
                        KeyCode::Up | KeyCode::Char('k') => model.select_prev(),
                        KeyCode::Char('p') => model.paused = !model.paused,
                        KeyCode::Char('?') => model.help = !model.help,
                        KeyCode::Char('/') => input = Input::Filter(String::new()),
                        KeyCode::Esc => { model.help = false; model.filter.clear(); }
                        _ => {}
                    },
                }
            }
        }
    }
}

/// The whole screen: the header, the table of loops, the recent reports, the selected loop's
/// detail, the footer, and the help over them when asked for.
fn draw(f: &mut Frame, m: &Model, input: &Input) {
    // Header: three lines plus the PAUSED marker, inside borders.
    let [header, table, recent, detail, footer] = Layout::vertical([
        Constraint::Length(6),
        Constraint::Min(6),
        Constraint::Length(8),
        Constraint::Min(8),
        Constraint::Length(1),
    ])
    .areas(f.area());
    f.render_widget(header_widget(m), header);
    f.render_widget(loops_table(m), table);
    let items: Vec<ListItem> = m.recent.iter().map(|l| ListItem::new(l.as_str())).collect();
    f.render_widget(
        List::new(items).block(Block::new().borders(Borders::ALL).title(" recent reports ")),
        recent,
    );
    f.render_widget(detail_widget(m), detail);
    let foot = match input {
        Input::Filter(text) => format!("filter: {text}_   (Enter apply, Esc clear)"),
        Input::Normal => "q quit  j/k select  p pause  / filter  ? help".to_string(),
    };
    f.render_widget(Paragraph::new(foot), footer);
    if m.help {
        let area = f.area().inner(ratatui::layout::Margin::new(10, 5));
        f.render_widget(Clear, area);
        f.render_widget(help_widget(), area);
    }
}

/// The header's lines, and PAUSED while paused.
fn header_widget(m: &Model) -> Paragraph<'static> {
    let mut head: Vec<Line> = m.header_lines().into_iter().map(Line::from).collect();
    if m.paused {
        head.push(
            Line::from("PAUSED (p to resume)").style(Style::new().add_modifier(Modifier::BOLD)),
        );
    }
    Paragraph::new(head).block(
        Block::new()
            .borders(Borders::ALL)
            .title(" clb-probe watch "),
    )
}

/// One row per confirmed loop (the filter's), the selected one reversed.
fn loops_table(m: &Model) -> Table<'static> {
    let rows: Vec<TRow> = m
        .visible()
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let row = TRow::new(vec![
                r.kind.clone(),
                r.vip.clone(),
                r.port.clone(),
                r.count.to_string(),
                format!("{:.2}/s", r.rate),
                r.outcome.clone(),
                r.reason.clone(),
            ]);
            if i == m.selected {
                row.style(Style::new().add_modifier(Modifier::REVERSED))
            } else {
                row
            }
        })
        .collect();
    let title = if m.filter.is_empty() {
        " confirmed loopback ".to_string()
    } else {
        format!(" confirmed loopback (filter: {}) ", m.filter)
    };
    Table::new(
        rows,
        [
            Constraint::Length(22),
            Constraint::Length(16),
            Constraint::Length(5),
            Constraint::Length(7),
            Constraint::Length(9),
            Constraint::Length(9),
            Constraint::Min(10),
        ],
    )
    .header(TRow::new(vec![
        "KIND", "VIP", "PORT", "COUNT", "RATE", "OUTCOME", "REASON",
    ]))
    .block(Block::new().borders(Borders::ALL).title(title))
}

/// The selected loop's flow, evidence, remedy and fixes.
fn detail_widget(m: &Model) -> Paragraph<'static> {
    let detail_lines: Vec<Line> = match m.selected_row() {
        Some(r) => std::iter::once(Line::from(format!("{}  {}", r.kind, r.flow)))
            .chain(std::iter::once(Line::from("evidence:")))
            .chain(r.evidence.iter().map(|e| Line::from(format!("  - {e}"))))
            .chain(std::iter::once(Line::from("remedy:")))
            .chain(r.remedy.iter().map(|e| Line::from(format!("  - {e}"))))
            .chain((!r.fixes.is_empty()).then(|| Line::from("fixes:")))
            .chain(r.fixes.iter().map(|e| Line::from(format!("  - {e}"))))
            .collect(),
        None => vec![Line::from("no confirmed loopback events yet")],
    };
    Paragraph::new(detail_lines)
        .wrap(Wrap { trim: false })
        .block(Block::new().borders(Borders::ALL).title(" detail "))
}

/// The keys (`?`).
fn help_widget() -> Paragraph<'static> {
    Paragraph::new(vec![
        Line::from("HELP"),
        Line::from(""),
        Line::from("q        quit"),
        Line::from("j / Down select the next event"),
        Line::from("k / Up   select the previous event"),
        Line::from("p        pause / resume the view"),
        Line::from("/        filter by kind, VIP or address (Enter applies, Esc clears)"),
        Line::from("?        this help (? or Esc closes)"),
    ])
    .block(Block::new().borders(Borders::ALL).title(" help "))
}
