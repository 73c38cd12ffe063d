// Tests for StopStringMatcher: hold-back, matches across deltas, UTF-8 boundaries.
#include "engine/sample/stop_string_matcher.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace sluice {
namespace {

// Pushes `deltas` in order and returns everything emitted (plus Flush when not stopped).
struct Streamed {
  std::string text;
  bool stopped = false;
};
Streamed Stream(StopStringMatcher& matcher, const std::vector<std::string>& deltas) {
  Streamed out;
  for (const std::string& delta : deltas) {
    const StopStringMatcher::Result result = matcher.Push(delta);
    out.text += result.text;
    out.stopped = result.stopped;
  }
  if (!out.stopped) out.text += matcher.Flush();
  return out;
}

TEST(StopStringMatcherTest, NoStopsPassesTextThrough) {
  StopStringMatcher matcher({}, false);
  EXPECT_EQ(matcher.Push("hello ").text, "hello ");
  EXPECT_EQ(matcher.Push("world").text, "world");
  EXPECT_EQ(matcher.Flush(), "");
  EXPECT_FALSE(matcher.stopped());
}

TEST(StopStringMatcherTest, EmptyStopStringsAreIgnored) {
  StopStringMatcher matcher({"", "x"}, false);
  const StopStringMatcher::Result result = matcher.Push("abc");
  EXPECT_EQ(result.text, "abc");
  EXPECT_FALSE(result.stopped);
}

TEST(StopStringMatcherTest, StopAcrossDeltas) {
  StopStringMatcher matcher({"STOP"}, false);
  StopStringMatcher::Result first = matcher.Push("hello ST");
  EXPECT_EQ(first.text, "hello ");
  EXPECT_FALSE(first.stopped);
  StopStringMatcher::Result second = matcher.Push("OP more");
  EXPECT_EQ(second.text, "");
  EXPECT_TRUE(second.stopped);
  EXPECT_TRUE(matcher.stopped());
  // After the stop nothing more is emitted.
  StopStringMatcher::Result after = matcher.Push("tail");
  EXPECT_EQ(after.text, "");
  EXPECT_TRUE(after.stopped);
  EXPECT_EQ(matcher.Flush(), "");
}

TEST(StopStringMatcherTest, HeldBackTextReleasedOnFlush) {
  StopStringMatcher matcher({"STOP"}, false);
  EXPECT_EQ(matcher.Push("abc S").text, "abc ");
  EXPECT_EQ(matcher.Push("T").text, "");
  EXPECT_EQ(matcher.Flush(), "ST");
  EXPECT_FALSE(matcher.stopped());
}

TEST(StopStringMatcherTest, PartialMatchThatFailsIsReleased) {
  StopStringMatcher matcher({"abc"}, false);
  EXPECT_EQ(matcher.Push("ab").text, "");
  StopStringMatcher::Result result = matcher.Push("d");
  EXPECT_EQ(result.text, "abd");
  EXPECT_FALSE(result.stopped);

  StopStringMatcher split({"abc"}, false);
  EXPECT_EQ(split.Push("xab").text, "x");
  result = split.Push("c");
  EXPECT_EQ(result.text, "");
  EXPECT_TRUE(result.stopped);
}

TEST(StopStringMatcherTest, OverlappingPrefixes) {
  StopStringMatcher matcher({"aab"}, false);
  EXPECT_EQ(matcher.Push("aa").text, "");
  EXPECT_EQ(matcher.Push("a").text, "a");  // "aaa": only the last "aa" may still match
  StopStringMatcher::Result result = matcher.Push("b");
  EXPECT_EQ(result.text, "");
  EXPECT_TRUE(result.stopped);
}

TEST(StopStringMatcherTest, EarliestMatchWins) {
  StopStringMatcher matcher({"world", "lo"}, false);
  StopStringMatcher::Result result = matcher.Push("hello world");
  EXPECT_EQ(result.text, "hel");
  EXPECT_TRUE(result.stopped);

  // "bc" completes before "abcd", whether the text comes at once or byte by byte.
  StopStringMatcher at_once({"abcd", "bc"}, false);
  EXPECT_EQ(Stream(at_once, {"xabcd"}).text, "xa");
  StopStringMatcher bytewise({"abcd", "bc"}, false);
  const Streamed streamed = Stream(bytewise, {"x", "a", "b", "c", "d"});
  EXPECT_EQ(streamed.text, "xa");
  EXPECT_TRUE(streamed.stopped);
}

TEST(StopStringMatcherTest, IncludeStopStringInOutput) {
  StopStringMatcher matcher({"</s>", "###"}, true);
  const Streamed streamed = Stream(matcher, {"foo<", "/s", ">bar ###"});
  EXPECT_EQ(streamed.text, "foo</s>");
  EXPECT_TRUE(streamed.stopped);
}

TEST(StopStringMatcherTest, MultiByteTextAroundHoldBack) {
  // "日本" is E6 97 A5 E6 9C AC.
  StopStringMatcher matcher({"日本"}, false);
  EXPECT_EQ(matcher.Push("こんにちは日").text, "こんにちは");
  EXPECT_EQ(matcher.Push("曜").text, "日曜");
  StopStringMatcher::Result result = matcher.Push("日本語");
  EXPECT_EQ(result.text, "");
  EXPECT_TRUE(result.stopped);

  StopStringMatcher include({"日本"}, true);
  EXPECT_EQ(Stream(include, {"é日", "本語"}).text, "é日本");

  StopStringMatcher none({"本!"}, false);
  EXPECT_EQ(Stream(none, {"ça 本", "?"}).text, "ça 本?");
}

TEST(StopStringMatcherTest, NeverSplitsUtf8CharacterWhenHoldingBack) {
  // A byte-level stop string beginning with the last two bytes of "日" (97 A5): the suffix
  // "\x97\xA5" could start it, but the cut moves back to the start of the character.
  StopStringMatcher matcher({"\x97\xA5X"}, false);
  StopStringMatcher::Result result = matcher.Push("a日");
  EXPECT_EQ(result.text, "a");
  EXPECT_EQ(matcher.Flush(), "日");
}

}  // namespace
}  // namespace sluice
