//! The rows of a consumer batch, read out of its columns without copying
//! their bytes, and the one-line form `tail --print` gives each.

use anyhow::Context;
use arrow_array::Array;
use arrow_array::cast::AsArray;
use arrow_array::types::UInt64Type;
use flight_server::subscription::{ConsumerRow, RowKind};

/// One row of a consumer batch: the row the sink built, read back.
pub type Row<'a> = ConsumerRow<'a>;

/// The rows of `batch`, in order. A batch that lacks a column or names an
/// unknown kind of row is the sink's fault, and says so.
pub fn rows(batch: &arrow_array::RecordBatch) -> anyhow::Result<Vec<Row<'_>>> {
    let column = |name: &str| {
        batch
            .column_by_name(name)
            .with_context(|| format!("the sink sent a consumer batch without column {name:?}"))
    };
    let mistyped = |name: &str| {
        format!("the sink sent a consumer batch whose column {name:?} has another type")
    };
    let text = |name: &str| {
        column(name)?
            .as_string_opt::<i32>()
            .with_context(|| mistyped(name))
    };
    let number = |name: &str| {
        column(name)?
            .as_primitive_opt::<UInt64Type>()
            .with_context(|| mistyped(name))
    };
    let kind = text("kind")?;
    let path = text("path")?;
    let key = text("file_key")?;
    let generation = number("generation")?;
    let offset = number("offset")?;
    let data = column("data")?
        .as_binary_opt::<i32>()
        .with_context(|| mistyped("data"))?;
    let size = number("size")?;
    let digest = text("digest")?;
    let from_path = text("from_path")?;
    (0..batch.num_rows())
        .map(|i| {
            Ok(Row {
                kind: RowKind::parse(kind.value(i)).with_context(|| {
                    format!("the sink sent an unknown kind of row {:?}", kind.value(i))
                })?,
                path: path.value(i),
                file_key: key.value(i),
                generation: generation.value(i),
                offset: offset.value(i),
                data: data.value(i),
                size: size.is_valid(i).then(|| size.value(i)),
                digest: digest.is_valid(i).then(|| digest.value(i)),
                from_path: from_path.is_valid(i).then(|| from_path.value(i)),
            })
        })
        .collect()
}

/// The row as one line (without its newline): kind, path, key,
/// generation, offset, and what the kind adds (a data row's CRC-32C
/// and length, a rename's old path, a seal's size and digest).
pub fn line(row: &Row<'_>) -> String {
    let what = match row.kind {
        RowKind::Data => format!(
            "crc32c={:08x} {} bytes",
            flight_server::checksum::crc32c(row.data),
            row.data.len()
        ),
        RowKind::Renamed => format!("from {}", row.from_path.unwrap_or("?")),
        RowKind::Sealed => format!(
            "size {} digest {}",
            row.size.unwrap_or(0),
            row.digest.unwrap_or("?")
        ),
        RowKind::Opened | RowKind::Superseded => String::new(),
    };
    format!(
        "{:<10} {} key={} gen={} offset={} {what}",
        row.kind.as_str(),
        row.path,
        row.file_key,
        row.generation,
        row.offset
    )
}

#[cfg(test)]
mod tests {
    use flight_server::subscription::ConsumerBatchBuilder;

    use super::*;

    #[test]
    fn rows_read_back_as_they_were_built_and_print_on_one_line() {
        let mut builder = ConsumerBatchBuilder::new("src", 64);
        let data = ConsumerRow {
            kind: RowKind::Data,
            path: "a.dat",
            file_key: "k1",
            generation: 2,
            offset: 4096,
            data: b"bytes",
            size: None,
            digest: None,
            from_path: None,
        };
        let renamed = ConsumerRow {
            kind: RowKind::Renamed,
            path: "b.dat",
            data: &[],
            from_path: Some("a.dat"),
            ..data
        };
        builder.push(&data);
        builder.push(&renamed);
        let batch = builder.finish();
        let rows = rows(&batch).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(
            (
                rows[0].kind,
                rows[0].path,
                rows[0].file_key,
                rows[0].generation
            ),
            (RowKind::Data, "a.dat", "k1", 2)
        );
        assert_eq!((rows[0].offset, rows[0].data), (4096, &b"bytes"[..]));
        assert_eq!(rows[1].from_path, Some("a.dat"));
        let first = line(&rows[0]);
        assert!(!first.contains('\n'));
        assert!(first.starts_with("data       a.dat key=k1 gen=2 offset=4096 crc32c="));
        assert!(first.ends_with(" 5 bytes"), "{first}");
        assert!(line(&rows[1]).ends_with("from a.dat"));
    }

    #[test]
    fn a_batch_without_a_column_is_the_sinks_fault() {
        let empty = std::sync::Arc::new(arrow_schema::Schema::empty());
        let batch = arrow_array::RecordBatch::new_empty(empty);
        let error = rows(&batch).unwrap_err().to_string();
        assert!(error.contains("the sink sent"), "{error}");
    }
}
