"""Input a user gets slightly wrong, named as what it is: a .json file of records, one JSON list,
wide text, a weight that would turn the loss away, JSON cut off inside a string."""
import pytest

from spanflow.data.io import read_ner
from spanflow.data.records import read_records
from spanflow.errors import ConfigError, DataError
from spanflow.tasks.ner.features import class_weight_tensor


def test_a_json_file_of_one_record_a_line_is_read_as_jsonl(tmp_path):
    p = tmp_path / "records.json"
    p.write_text('{"id": "a1", "body": "Ada wrote"}\n{"id": "a2", "body": "Bob ran"}\n')
    assert list(read_records(str(p), field="body")) == [("a1", "Ada wrote"), ("a2", "Bob ran")]


def test_a_json_list_is_refused_with_how_to_make_jsonl(tmp_path):
    p = tmp_path / "array.json"
    p.write_text('[{"id": "a1", "text": "Ada wrote"}]\n')
    with pytest.raises(DataError, match=r"array\.json: is one JSON list; predict and embed read JSONL.*jq -c"):
        list(read_records(str(p)))


@pytest.mark.parametrize("encoding, said", [("utf-16", "is UTF-16 text (it starts with a UTF-16 byte-order mark)"),
                                            ("utf-16-le", "holds NUL bytes between its characters")])
def test_labelled_data_in_utf16_is_named_as_such(tmp_path, encoding, said):
    p = tmp_path / "train.conll"
    p.write_bytes("Ada\tB-PER\nLovelace\tI-PER\nwrote\tO\n\n".encode(encoding))
    with pytest.raises(DataError) as e:
        read_ner(str(p))
    assert said in str(e.value) and "iconv" in str(e.value)


def test_json_cut_off_inside_a_string_reads_as_one_sentence(tmp_path):
    p = tmp_path / "in.jsonl"
    p.write_text('{"text": "Ada wrote", "entities": [[0, 3, "PER"]]}\n{"text": "Bob ran\n')
    with pytest.raises(DataError) as e:
        read_ner(str(p))
    assert "Unterminated string starting at column 10" in str(e.value) and " at at " not in str(e.value)


@pytest.mark.parametrize("weights", ["PER=-1", "PER=0", {"PER": float("inf")}, {"PER": "2"}])
def test_a_class_weight_that_is_not_a_finite_number_above_zero_is_refused(weights):
    with pytest.raises(ConfigError, match="--class-weights: the weight of 'PER' must be a finite number above 0"):
        class_weight_tensor(weights, [], ["O", "B-PER", "I-PER"])
    assert class_weight_tensor("PER=2", [], ["O", "B-PER", "I-PER"]).tolist() == [1.0, 2.0, 2.0]
    with pytest.raises(ConfigError, match=r"unknown label 'per'; entity labels: PER \(or a BIO tag"):
        class_weight_tensor("per=2", [], ["O", "B-PER", "I-PER"])
