"""The recipes' downloads (§5.1 data): mirror URLs, sha256 checks, the cache,
and what is left behind when a download fails. Every server is a loopback
one (`helpers.loopback_http`)."""

import gzip
import hashlib
import io
import os
import zipfile

import pytest
from helpers import data_mirror, loopback_http, shared_data

from keras_transformer.data import downloads
from keras_transformer.data.corpora import load_multi30k, load_tatoeba

# What is tested here does not depend on the backend: it runs in one pass.
pytestmark = pytest.mark.once("torch")

FILES = {"a.txt": b"ein Hund\n", "b.txt": b"a dog\n"}


def corpus(files=FILES, member=None):
    """A corpus of `files` published under https://example.org/toy/."""
    if member is not None:
        (name, content), = files.items()
        return downloads.Corpus("toy", (downloads.RemoteFile(
            "https://example.org/toy/toy.zip", hashlib.sha256(content).hexdigest(),
            member=name),), "toy terms")
    return downloads.Corpus("toy", tuple(
        downloads.RemoteFile(f"https://example.org/toy/{name}", hashlib.sha256(content).hexdigest())
        for name, content in files.items()), "toy terms")


def zipped(files):
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, content in files.items():
            archive.writestr(name, content)
    return buffer.getvalue()


@pytest.fixture
def keras_home(tmp_path, monkeypatch):
    home = tmp_path / "keras_home"
    monkeypatch.setenv("KERAS_HOME", str(home))
    return home


def served(monkeypatch, base):
    monkeypatch.setenv(downloads.MIRROR_VARIABLE, base)


def test_source_url_puts_the_upstream_path_under_the_mirror(monkeypatch):
    multi30k, spa = downloads.MULTI30K.files[0].url, downloads.ANKI_SPA_ENG.files[0].url
    monkeypatch.delenv(downloads.MIRROR_VARIABLE, raising=False)
    assert downloads.source_url(multi30k) == multi30k
    monkeypatch.setenv(downloads.MIRROR_VARIABLE, "http://127.0.0.1:8000/")
    assert downloads.source_url(multi30k) == (
        f"http://127.0.0.1:8000/multi30k/dataset/{downloads.MULTI30K_COMMIT}/data/task1/raw/"
        "train.en.gz")
    assert downloads.source_url(spa) == (
        "http://127.0.0.1:8000/download.tensorflow.org/data/spa-eng.zip")
    monkeypatch.setenv(downloads.MIRROR_VARIABLE, "127.0.0.1:8000")
    with pytest.raises(downloads.DownloadError, match="is not a URL"):
        downloads.source_url(spa)


def test_fetch_downloads_verifies_and_then_reads_the_cache_without_network(
        monkeypatch, keras_home):
    toy, printed = corpus(), []
    with loopback_http({f"/toy/{name}": content for name, content in FILES.items()}) as base:
        served(monkeypatch, base)
        directory = downloads.fetch(toy, printed.append)
    assert directory == str(keras_home / "datasets" / "keras_transformer" / "toy")
    assert {name: open(os.path.join(directory, name), "rb").read() for name in FILES} == FILES
    assert len(printed) == 1 and "toy terms" in printed[0]
    # The server is gone: a second fetch must not need it, and says nothing.
    assert downloads.fetch(toy, printed.append) == directory
    assert len(printed) == 1


def test_a_damaged_cached_file_is_downloaded_again(monkeypatch, keras_home):
    toy = corpus()
    with loopback_http({f"/toy/{name}": content for name, content in FILES.items()}) as base:
        served(monkeypatch, base)
        directory = downloads.fetch(toy, print_fn=lambda message: None)
        with open(os.path.join(directory, "a.txt"), "wb") as file:
            file.write(b"half a")
        downloads.fetch(toy, print_fn=lambda message: None)
    assert open(os.path.join(directory, "a.txt"), "rb").read() == FILES["a.txt"]


@pytest.mark.parametrize("served_body", [
    b"a cat\n",  # a different file
    (FILES["a.txt"][:3], len(FILES["a.txt"])),  # truncated: fewer bytes than announced
    None,  # missing: 404
], ids=["corrupted", "truncated", "missing"])
@pytest.mark.backs("docs/training.md", "A truncated or corrupted download is deleted and refused")
def test_a_bad_download_is_refused_and_nothing_of_it_is_kept(monkeypatch, keras_home,
                                                             served_body):
    files = {"/toy/b.txt": FILES["b.txt"]}
    if served_body is not None:
        files["/toy/a.txt"] = served_body
    with loopback_http(files) as base:
        served(monkeypatch, base)
        with pytest.raises(downloads.DownloadError, match="Nothing was kept") as error:
            downloads.fetch(corpus(), print_fn=lambda message: None)
    assert "/toy/a.txt" in str(error.value)
    if served_body == b"a cat\n":
        assert hashlib.sha256(b"a cat\n").hexdigest() in str(error.value)
    directory = keras_home / "datasets" / "keras_transformer" / "toy"
    assert not (directory / "a.txt").exists()


def test_an_archive_member_is_kept_only_when_its_sha256_matches(monkeypatch, keras_home):
    member = {"toy/pairs.txt": b"Go.\tVe.\n"}
    with loopback_http({"/toy/toy.zip": zipped(member)}) as base:
        served(monkeypatch, base)
        directory = downloads.fetch(corpus(member, member=True), print_fn=lambda m: None)
    assert os.listdir(directory) == ["pairs.txt"]  # the archive itself is not kept
    assert open(os.path.join(directory, "pairs.txt"), "rb").read() == member["toy/pairs.txt"]


@pytest.mark.parametrize("archive", [
    zipped({"toy/pairs.txt": b"Go.\tVete.\n"}),  # another release
    zipped({"toy/other.txt": b"Go.\tVe.\n"}),  # no such member
    b"PK\x03\x04 not really a zip",  # damaged
], ids=["other-content", "no-member", "not-a-zip"])
def test_a_bad_archive_is_refused_and_nothing_of_it_is_kept(monkeypatch, keras_home, archive):
    with loopback_http({"/toy/toy.zip": archive}) as base:
        served(monkeypatch, base)
        with pytest.raises(downloads.DownloadError, match="Nothing was kept"):
            downloads.fetch(corpus({"toy/pairs.txt": b"Go.\tVe.\n"}, member=True),
                            print_fn=lambda message: None)
    directory = keras_home / "datasets" / "keras_transformer" / "toy"
    assert not directory.exists() or os.listdir(directory) == []


def test_the_pinned_hashes_match_the_real_corpora(monkeypatch, keras_home):
    # The shared copies are byte-identical to upstream, so a mirror of them
    # must pass every pinned sha256.
    with loopback_http(data_mirror()) as base:
        served(monkeypatch, base)
        multi30k = downloads.fetch_multi30k(print_fn=lambda message: None)
        spa = downloads.fetch_anki_spa_eng(print_fn=lambda message: None)
    splits = load_multi30k(multi30k, "de-en")
    assert [len(splits[name].sources) for name in ("train", "validation", "test")] == [
        29000, 1014, 1000]
    with gzip.open(shared_data("anki", "spa-eng", "spa.txt.gz")) as file:
        assert open(spa, "rb").read() == file.read()
    assert sum(len(split.sources) for split in load_tatoeba(spa).values()) == 118964
