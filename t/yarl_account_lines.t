#!/usr/bin/perl

# Several yarl_account lines in one location count together or not at all: a request is
# counted on every line's quota, or, when any of them rejects, on none. Six lines here, more
# than the handler keeps on its stack, so the lines past the fourth take the other path.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get status_of header_of);

my $t = Test::Yarl->new();
$t->write_file('index.html', "hello\n");
$t->write_http_conf(<<'EOF');
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 100ms;
    server {
        listen 127.0.0.1:%%PORT_8080%%;
        root %%TESTDIR%%;
        location / {
            yarl_account a1;
            yarl_account a2;
            yarl_account a3 2;
            yarl_account a4;
            yarl_account a5;
            yarl_account a6;
            add_header X-Yarl-Quota $yarl_quota always;
        }
        location = /stats {
            yarl_stats;
        }
    }
EOF
$t->run_root('A');
# a1..a5 never reject; a6 (the last line) takes 3 units, then rejects. All barely drain.
$t->put_quota("a$_", 0.001, 1000, 2000) for 1 .. 5;
$t->put_quota('a6', 0.001, 3, 3);
$t->run();
ok($t->wait_quota($t->port(8080), $_, 5), "nginx has quota $_") for map { "a$_" } 1 .. 6;

my @r = map { http_get($t->port(8080), '/index.html') } 1 .. 6;
my @passed = grep { status_of($_) == 200 } @r;
my $p = @passed;
cmp_ok($p, '>=', 1, 'the first requests pass');
cmp_ok($p, '<', 6, 'the sixth line rejects once its quota is full');
is(header_of($passed[0], 'X-Yarl-Quota'), 'a6', 'a pass names the last line');
my @rejected = grep { status_of($_) == 429 } @r;
is(scalar(@rejected), 6 - $p, 'the others are rejected');
is(header_of($rejected[0], 'X-Yarl-Quota'), 'a6', 'by the sixth line') if @rejected;

sub fill {
	my ($q) = @_;
	my ($s, $b) = $t->admin('GET', "/v1/quotas/$q", undef, 'A');
	return ref $b && $b->{counter} ? $b->{counter}{fill} : -1;
}
ok($t->wait_for(sub { fill('a1') >= $p - 0.01 }, 5), 'the root has the counts');
# Exact sums: every quota was counted for the requests that passed, none for the rejected.
for my $q (qw(a1 a2 a4 a5)) {
	cmp_ok(abs(fill($q) - $p), '<', 0.01, "$q counted once per passed request");
}
cmp_ok(abs(fill('a3') - 2 * $p), '<', 0.01, 'a3 with its weight of 2');
# The root keeps a counter at most at its high_burst (plus 0.25 s of its limit).
cmp_ok(fill('a6'), '>', 2.99, 'a6 is full');

$t->finish();
done_testing();
