//! Unit tests of lexical tool retrieval.

use super::*;

fn index(docs: &[(&str, &str)]) -> ToolIndex {
    ToolIndex::new(docs).unwrap()
}

fn names(index: &ToolIndex, query: &str, limit: usize) -> Vec<String> {
    index
        .search(query, limit)
        .unwrap()
        .into_iter()
        .map(|(i, _)| index.names()[i].clone())
        .collect()
}

#[test]
fn tables_are_sorted_for_binary_search() {
    assert!(STOP_WORDS.windows(2).all(|w| w[0] < w[1]));
    assert!(ACTION_SYNONYMS.windows(2).all(|w| w[0].0 < w[1].0));
    // Keys are stems, so that every form of the verb finds them.
    let verbs = [
        "add", "change", "destroy", "download", "edit", "erase", "fetch", "find", "generate",
        "insert", "lookup", "make", "modify", "purge", "remove", "retrieve",
    ];
    let stems: Vec<String> = verbs.iter().map(|v| stem(v)).collect();
    let keys: Vec<&str> = ACTION_SYNONYMS.iter().map(|(k, _)| *k).collect();
    assert_eq!(stems, keys);
}

#[test]
fn action_verbs_add_their_operation() {
    assert_eq!(tokenize("add a row"), ["add", "creat", "row"]);
    assert_eq!(tokenize("adding rows"), ["add", "creat", "row"]);
    assert_eq!(tokenize("Removes the file"), ["remov", "delet", "fil"]);
    assert_eq!(tokenize("modified"), ["modify", "updat"]);
    let idx = index(&[
        ("row.create", "Create a row"),
        ("row.delete", "Delete a row"),
        ("row.get", "Get a row"),
    ]);
    assert_eq!(names(&idx, "add a row", 1), ["row.create"]);
    assert_eq!(names(&idx, "remove that row", 1), ["row.delete"]);
    assert_eq!(names(&idx, "fetch the row", 1), ["row.get"]);
}

#[test]
fn splits_names_of_every_style() {
    assert_eq!(
        tokenize("crm.contacts.search"),
        ["crm", "contact", "search"]
    );
    assert_eq!(tokenize("get_weather"), ["get", "weather"]);
    assert_eq!(tokenize("getWeather"), ["get", "weather"]);
    assert_eq!(tokenize("getHTTPResponse"), ["get", "http", "respons"]);
    assert_eq!(tokenize("HTTPServer"), ["http", "server"]);
    assert_eq!(tokenize("IPv6 s3Bucket"), ["ipv6", "s3", "bucket"]);
    assert_eq!(tokenize("fs-read/v2"), ["fs", "read", "v2"]);
    // An acronym's plural is one word; a capital and a word after it are two.
    assert_eq!(tokenize("listAPIs"), ["list", "api"]);
    assert_eq!(tokenize("getURLsForTag"), ["get", "url", "tag"]);
    assert_eq!(tokenize("SDKs GPUs IDs"), ["sdk", "gpu", "id"]);
    assert_eq!(tokenize("fetchIDs"), ["fetch", "get", "id"]);
    assert_eq!(tokenize("HTTPSession"), ["http", "session"]);
    assert_eq!(tokenize("  ...  "), Vec::<String>::new());
}

#[test]
fn drops_stop_words() {
    assert_eq!(
        tokenize("Please create a new invoice for ACME"),
        ["creat", "new", "invoic", "acm"]
    );
}

#[test]
fn stems_forms_of_a_word_alike() {
    for group in [
        &["weather", "weathers"][..],
        &["read", "reads", "reading"],
        &["create", "creates", "created", "creating"],
        &["run", "runs", "running"],
        &["query", "queries", "queried"],
        &["search", "searches", "searching", "searched"],
        &["box", "boxes"],
        &["address", "addresses"],
        &["stop", "stopped", "stopping"],
        &["add", "adds", "added", "adding"],
    ] {
        let stems: Vec<String> = group.iter().map(|w| stem(w)).collect();
        assert!(
            stems.iter().all(|s| *s == stems[0]),
            "{group:?} -> {stems:?}"
        );
    }
}

#[test]
fn keeps_words_a_suffix_rule_would_break() {
    assert_eq!(stem("status"), "status");
    assert_eq!(stem("analysis"), "analysis");
    assert_eq!(stem("string"), "string");
    assert_eq!(stem("need"), "need");
    assert_eq!(stem("bus"), "bus");
    assert_eq!(stem("fill"), "fill");
    assert_eq!(stem("filling"), "fill");
}

#[test]
fn unicode() {
    assert_eq!(tokenize("Überprüfe WETTER"), ["überprüfe", "wetter"]);
    assert_eq!(
        tokenize("查詢台北天氣"),
        ["查詢", "詢台", "台北", "北天", "天氣"]
    );
    assert_eq!(tokenize("天 weather"), ["天", "weather"]);
    assert_eq!(tokenize("天気forecast"), ["天気", "forecast"]);
    let idx = index(&[("weather.get", "取得天氣預報"), ("fs.read", "讀取檔案")]);
    assert_eq!(names(&idx, "台北的天氣如何", 5), ["weather.get"]);
}

#[test]
fn name_outweighs_description() {
    let idx = index(&[
        ("invoice.create", "Make a record"),
        ("record.make", "Make an invoice record"),
    ]);
    assert_eq!(names(&idx, "invoice", 2), ["invoice.create", "record.make"]);
}

#[test]
fn rarer_terms_count_more() {
    let idx = index(&[
        ("a", "list contacts"),
        ("b", "list invoices"),
        ("c", "list orders"),
    ]);
    let hits = idx.search("list invoices", 3).unwrap();
    assert_eq!(hits[0].0, 1);
    assert!(hits[0].1 > hits[1].1);
    assert_eq!(hits.len(), 3);
}

#[test]
fn ties_are_broken_by_name() {
    let idx = index(&[
        ("zeta", "send mail"),
        ("alpha", "send mail"),
        ("mid", "send mail"),
    ]);
    let hits = idx.search("mail", 3).unwrap();
    assert_eq!(hits.iter().map(|h| h.0).collect::<Vec<_>>(), [1, 2, 0]);
    assert!(hits.iter().all(|h| h.1 == hits[0].1));
    // The same order however many are asked for.
    assert_eq!(names(&idx, "mail", 2), ["alpha", "mid"]);
    assert_eq!(names(&idx, "mail", 1), ["alpha"]);
}

#[test]
fn prefixes_match_at_a_discount() {
    let idx = index(&[
        ("auth.login", "Authenticate a user"),
        ("auth", "Authorization check"),
        ("other", "Nothing"),
    ]);
    assert_eq!(names(&idx, "authent", 3), ["auth.login"]);
    let exact = idx.search("authenticate", 1).unwrap()[0].1;
    let prefix = idx.search("authent", 1).unwrap()[0].1;
    assert!((prefix - exact * PREFIX_WEIGHT).abs() < 1e-12);
    // Two characters are not enough.
    assert!(idx.search("au", 3).unwrap().is_empty());
}

#[test]
fn empty_queries_and_indexes() {
    let idx = index(&[("a", "b c")]);
    assert!(idx.search("", 5).unwrap().is_empty());
    assert!(idx.search("the of a", 5).unwrap().is_empty());
    assert!(idx.search("c", 0).unwrap().is_empty());
    let empty = ToolIndex::new::<&str, &str>(&[]).unwrap();
    assert!(empty.is_empty());
    assert!(empty.search("anything", 5).unwrap().is_empty());
}

#[test]
fn bounds() {
    let long_name = "n".repeat(MAX_NAME_BYTES + 1);
    let long_text = "t".repeat(MAX_TEXT_BYTES + 1);
    assert_eq!(
        ToolIndex::new(&[("", "x")]).err(),
        Some(RetrievalError::EmptyName(0))
    );
    assert!(matches!(
        ToolIndex::new(&[(long_name.as_str(), "x")]),
        Err(RetrievalError::NameTooLong { index: 0, .. })
    ));
    assert!(matches!(
        ToolIndex::new(&[("a", long_text.as_str())]),
        Err(RetrievalError::TextTooLong { .. })
    ));
    assert_eq!(
        ToolIndex::new(&[("a", "x"), ("a", "y")]).err(),
        Some(RetrievalError::DuplicateName("a".into()))
    );
    let many: Vec<(String, &str)> = (0..=MAX_DOCUMENTS).map(|i| (i.to_string(), "")).collect();
    assert_eq!(
        ToolIndex::new(&many).err(),
        Some(RetrievalError::TooManyDocuments(MAX_DOCUMENTS + 1))
    );
    let idx = index(&[("a", "b")]);
    let query = "q".repeat(MAX_QUERY_BYTES + 1);
    assert_eq!(
        idx.search(&query, 1).err(),
        Some(RetrievalError::QueryTooLong(MAX_QUERY_BYTES + 1))
    );
    assert!(idx.search(&"q ".repeat(MAX_QUERY_BYTES / 2), 1).is_ok());
}

#[test]
fn limit_keeps_the_best() {
    let docs: Vec<(String, String)> = (0..50)
        .map(|i| {
            (
                format!("tool{i:02}"),
                format!("word {}", "hit ".repeat(i % 7)),
            )
        })
        .collect();
    let idx = ToolIndex::new(&docs).unwrap();
    let all = idx.search("hit", 50).unwrap();
    let top = idx.search("hit", 5).unwrap();
    assert_eq!(&all[..5], &top[..]);
    assert!(all.windows(2).all(|w| w[0].1 >= w[1].1));
}
