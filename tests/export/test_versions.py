"""SavedModel version folders: the TF Serving layout, atomic versions, loading."""

import os

import pytest

from keras_transformer.export import versions

# What is tested here does not depend on the backend: it runs in one pass.
pytestmark = pytest.mark.once("torch")


def test_versions_are_the_numeric_folders_in_order(tmp_path):
    for name in ("2", "10", "1", ".partial-3-1-x", "notes"):
        (tmp_path / name).mkdir()
    (tmp_path / "7").write_text("a file, not a version")
    assert versions.versions(str(tmp_path)) == [1, 2, 10]
    assert versions.next_version(str(tmp_path)) == 11
    assert versions.next_version(str(tmp_path / "new")) == 1


def test_next_version_refuses_taken_and_invalid_versions(tmp_path):
    (tmp_path / "3").mkdir()
    assert versions.next_version(str(tmp_path), 4) == 4
    with pytest.raises(FileExistsError, match="never overwritten"):
        versions.next_version(str(tmp_path), 3)
    for bad in (0, -1, True, 2.0, "5"):
        with pytest.raises(ValueError, match="must be a positive integer"):
            versions.next_version(str(tmp_path), bad)


def test_a_version_appears_only_when_complete(tmp_path):
    base = str(tmp_path / "model")
    with versions.write_version(base, 1) as partial:
        versions.write_metadata(partial, {"beam_size": 4})
        assert versions.versions(base) == []
        assert os.path.basename(partial) == f".partial-{os.getpid()}-1"
    assert os.listdir(base) == ["1"]
    assert versions.read_metadata(os.path.join(base, "1")) == {"beam_size": 4}


def test_a_failed_write_leaves_nothing(tmp_path):
    base = str(tmp_path / "model")
    with pytest.raises(RuntimeError, match="disk full"):
        with versions.write_version(base, 1) as partial:
            versions.write_metadata(partial, {})
            raise RuntimeError("disk full")
    assert os.listdir(base) == []


def test_partials_of_dead_processes_are_removed(tmp_path):
    dead = tmp_path / ".partial-999999999-1"  # no such process
    alive = tmp_path / f".partial-{os.getpid()}-2"
    dead.mkdir()
    alive.mkdir()
    with versions.write_version(str(tmp_path), 3):
        pass
    assert sorted(os.listdir(tmp_path)) == sorted(["3", alive.name])


def test_a_missing_metadata_file_names_the_exporter(tmp_path):
    with pytest.raises(FileNotFoundError, match="keras-transformer export"):
        versions.read_metadata(str(tmp_path))

def test_loading_a_directory_without_versions_says_how_to_fix_it(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="keras-transformer export"):
        versions.load_saved_model(str(tmp_path / "empty"))

